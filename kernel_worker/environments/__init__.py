"""Locked environments: a notebook's ``uv.lock`` built once per host, and kernels' overlays.

A request's ``params.environment`` becomes an :class:`EnvironmentSpec` through
:func:`parse_environment`; an :class:`EnvironmentStore` turns a spec into a
:class:`BuiltEnvironment` on disk (``ensure``), gives it a kernel overlay
(``ensure_kernel_overlay``), and reports and evicts by disk use. :func:`probe_uv` finds the
uv it all runs on. Modules: ``spec`` (the request's value), ``store`` (build or fetch,
once), ``layout`` (the directory layout shared with Strata's reference worker),
``locking`` (the cross-process lock), ``registry`` (prebuilt archives), ``sources`` (the
source-build refusal), ``overlay`` (kernel packages), ``disk`` (usage, eviction), ``uv``
(running uv), ``errors`` (the exception tree).
"""

from __future__ import annotations

from .disk import EnvironmentUsage
from .errors import (
    EnvironmentBuildError,
    EnvironmentSpecError,
    LockedEnvironmentError,
    SourceBuildRefused,
)
from .overlay import KERNEL_REQUIREMENTS
from .registry import archive_url
from .spec import EnvironmentSpec, lock_key, parse_environment
from .store import (
    BuiltEnvironment,
    EnvironmentOrigin,
    EnvironmentStore,
    default_registry_url,
    default_root,
)
from .uv import probe_uv

__all__ = [
    "KERNEL_REQUIREMENTS",
    "BuiltEnvironment",
    "EnvironmentBuildError",
    "EnvironmentOrigin",
    "EnvironmentSpec",
    "EnvironmentSpecError",
    "EnvironmentStore",
    "EnvironmentUsage",
    "LockedEnvironmentError",
    "SourceBuildRefused",
    "archive_url",
    "default_registry_url",
    "default_root",
    "lock_key",
    "parse_environment",
    "probe_uv",
]
