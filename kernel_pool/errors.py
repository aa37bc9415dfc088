"""The pool's exception tree.

All failures the pool reports derive from :class:`PoolError`. Foreign exceptions are
translated where the pool meets them: jupyter_client's where a process is launched
(``launch.py``), zmq's where the channels read (``channels.py``: they become the kernel's
events), the fork server's where its replies are read; only an OS error making the pool's own
folders reaches a caller untranslated::

    PoolError
    ├── PoolClosed            the pool is shutting down or was never started
    ├── PoolBusy              no kernel became free within the caller's wait
    ├── KernelStartError      a kernel process could not be started or never became ready
    │   ├── PreloadError      the preload raised, or left what a fork cannot copy
    │   └── KernelInitError   the per-kernel stage (``kernel_init``) raised
    └── ExecutionError        something went wrong while a lease was executing code
        ├── ExecutionTimeout  the deadline passed (the kernel was interrupted, then killed)
        └── KernelDied        the kernel process exited during the lease
            └── KernelNoReply the kernel went idle without replying (retired as dead)
"""

from __future__ import annotations


class PoolError(Exception):
    """Base class of every error raised by :mod:`kernel_pool`."""


class PoolClosed(PoolError):
    """The pool no longer hands out leases."""


class PoolBusy(PoolError):
    """Every kernel stayed busy for longer than the caller was willing to wait."""


class KernelStartError(PoolError):
    """A kernel could not be started, or did not become ready in time."""


class PreloadError(KernelStartError):
    """The preload code raised (in the kernel, or in the template), or left what a fork
    cannot copy; ``str()`` is ``"<Type>: <message>"`` or says what it left."""


class KernelInitError(KernelStartError):
    """The per-kernel stage (``kernel_init``) raised in a kernel; ``str()`` as above."""


class ExecutionError(PoolError):
    """Base of the errors that end an execution on a lease."""


class ExecutionTimeout(ExecutionError):
    """The execution passed its deadline; the kernel is retired."""

    def __init__(self, timeout_seconds: float) -> None:
        super().__init__(f"execution exceeded its deadline of {timeout_seconds:g}s")
        self.timeout_seconds = timeout_seconds


class KernelDied(ExecutionError):
    """The kernel process exited while the lease was using it."""

    def __init__(self, exit_code: int | None) -> None:
        super().__init__(f"kernel process died (exit status {exit_code})")
        self.exit_code = exit_code


class KernelNoReply(KernelDied):
    """The kernel went idle without replying to the request: its handler for it failed (a
    cell broke the kernel's own machinery). The process lives, but it is retired as dead."""

    def __init__(self, message: str = "kernel went idle without replying to the request") -> None:
        ExecutionError.__init__(self, message)
        self.exit_code = None
