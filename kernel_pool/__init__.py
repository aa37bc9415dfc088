"""Warm Jupyter kernels: start, preload, lease, reset, restart, retire; a pool per kernel
kind (:class:`PoolSet`).

Knows nothing of HTTP, bundles or what cells mean; depends on jupyter_client, pyzmq and
psutil (and nothing of the worker, which import-linter checks).
"""

from .config import PoolConfig, RecyclePolicy
from .errors import (
    ExecutionError,
    ExecutionTimeout,
    KernelDied,
    KernelInitError,
    KernelNoReply,
    KernelStartError,
    PoolBusy,
    PoolClosed,
    PoolError,
    PreloadError,
)
from .kernel import KernelState
from .kinds import DEFAULT_KIND, KernelKind, LanguageCode
from .lease import Lease, RetireReason
from .memory import PoolMemory, ProcessMemory
from .messages import STREAM_DROPPED_MSG_TYPE, ExecuteResult, Output, dropped_characters
from .pool import Pool
from .pools import KindPoolStats, PoolSet
from .shipping import KernelSetup, ShippedPackage
from .stats import DurationSummary, PoolStats

__all__ = [
    "DEFAULT_KIND",
    "STREAM_DROPPED_MSG_TYPE",
    "DurationSummary",
    "ExecuteResult",
    "ExecutionError",
    "ExecutionTimeout",
    "KernelDied",
    "KernelInitError",
    "KernelKind",
    "KernelNoReply",
    "KernelSetup",
    "KernelStartError",
    "KernelState",
    "KindPoolStats",
    "LanguageCode",
    "Lease",
    "Output",
    "Pool",
    "PoolBusy",
    "PoolClosed",
    "PoolConfig",
    "PoolError",
    "PoolMemory",
    "PoolSet",
    "PoolStats",
    "PreloadError",
    "ProcessMemory",
    "RecyclePolicy",
    "RetireReason",
    "ShippedPackage",
    "dropped_characters",
]
