"""One pool's configuration: a frozen value (the kernel kind it serves, its size and
policies), validated when it is made; and :class:`RecyclePolicy`."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .kinds import DEFAULT_KIND, KernelKind
from .shipping import NO_SETUP, KernelSetup


class RecyclePolicy(enum.Enum):
    """What happens to a kernel after a lease."""

    RESET = "reset"  # reset to the warm baseline and reuse
    FRESH = "fresh"  # never reuse: retire after every lease


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """Everything the pool needs to know; see ``README.md`` for the user-facing meaning."""

    size: int = 2
    """Kernels that may be leased at once."""
    spares: int = 0
    """Extra warm kernels kept ready so a retirement never makes a request wait."""
    kind: KernelKind = DEFAULT_KIND
    """What starts the pool's kernels (interpreter or kernelspec, fork or spawn, preload)."""
    setup: KernelSetup = NO_SETUP
    """What every kernel runs at start, before the preload: packages shipped into it (e.g. a
    worker's agent) and the function that installs them."""
    recycle: RecyclePolicy = RecyclePolicy.RESET
    max_uses: int | None = None
    max_kernel_memory: int | None = None
    """Retire a kernel whose RSS (children included) exceeds this many bytes after a lease."""
    gpu_slots: tuple[str, ...] = ()
    """Values for ``CUDA_VISIBLE_DEVICES``, handed out one per kernel, round robin."""
    env: Mapping[str, str] | None = None
    """Environment for kernel processes; ``None`` copies the pool's own environment."""
    kernel_user: str | None = None
    """One unprivileged user all kernels run as (they are isolated from the pool, not from
    one another: see ``kernel_uids``)."""
    kernel_group: str | None = None
    kernel_uids: tuple[int, int] | None = None
    """First and last uid (inclusive) of a range: each kernel runs as its own uid (its gid
    the same number; no passwd entry needed), so kernels cannot signal, trace or reach one
    another. A uid is given to a new kernel only once no process runs as it."""
    kernel_cwd: Path | None = None
    runtime_dir: Path | None = None
    """Parent of the pool's private (0700) directory; ``None`` uses the system temp dir."""
    interrupt_grace_seconds: float = 2.0
    start_timeout_seconds: float = 60.0
    reset_timeout_seconds: float = 10.0
    shutdown_timeout_seconds: float = 10.0
    restart_backoff_seconds: tuple[float, float] = (0.5, 30.0)
    """First and largest delay between failed kernel starts."""
    extra_arguments: tuple[str, ...] = field(default=())
    max_iopub_message: int | None = None
    """The most bytes one IOPub message of a kernel may take; ``None``: any. What the kernel
    itself would send over it (an error's value and traceback, a display, a comm's data) is
    cut there to fit, with a note of what was left out. A larger message (sent around the
    kernel's own session) is dropped unread (with what the kernel queued behind it), the
    execution is told on its stderr, and the kernel is retired after the lease. With
    ``stream_cap``, the kernel's own stdout and stderr go out in messages under 1 MiB. It
    bounds what the pool holds of a kernel's outputs at a few such messages, whatever the
    kernel sends."""

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("size must be at least 1")
        if self.spares < 0:
            raise ValueError("spares must not be negative")
        if self.max_uses is not None and self.max_uses < 1:
            raise ValueError("max_uses must be at least 1")
        if self.max_kernel_memory is not None and self.max_kernel_memory < 1:
            raise ValueError("max_kernel_memory must be positive")
        if self.max_iopub_message is not None and self.max_iopub_message < 1:
            raise ValueError("max_iopub_message must be positive")
        if self.interrupt_grace_seconds < 0:
            raise ValueError("interrupt_grace_seconds must not be negative")
        if any(not slot.strip() for slot in self.gpu_slots):
            raise ValueError("gpu slot ids must not be blank")
        if self.kernel_uids is not None:
            first, last = self.kernel_uids
            if self.kernel_user is not None:
                raise ValueError("kernel_uids and kernel_user are exclusive")
            if first < 1 or last < first:
                raise ValueError("kernel_uids must be a range of positive uids, first to last")
            if last - first + 1 < self.target_kernels + 1:
                raise ValueError(
                    f"kernel_uids holds {last - first + 1} uids; the pool needs "
                    f"{self.target_kernels + 1} (one per kernel and one for a replacement)"
                )

    @property
    def target_kernels(self) -> int:
        """How many kernels the pool keeps alive: the leasable ones plus spares."""
        return self.size + self.spares
