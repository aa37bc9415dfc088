"""The handle a caller holds while it has exclusive use of one kernel."""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .errors import ExecutionTimeout, KernelDied
from .kernel import Kernel
from .messages import ExecuteResult, Output
from .replies import OutputCallback


class RetireReason(enum.Enum):
    """Why a kernel left the pool; each is counted in the pool's stats."""

    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    DIED = "died"
    FAILED_RESET = "failed_reset"
    MAX_USES = "max_uses"
    MEMORY = "memory"
    FRESH_POLICY = "fresh_policy"
    SHUTDOWN = "shutdown"
    REQUESTED = "requested"


class Lease:
    """Exclusive use of one ready kernel until the ``async with`` block ends."""

    def __init__(self, kernel: Kernel, wait_seconds: float, *, reusable: bool = True) -> None:
        self._kernel = kernel
        self.wait_seconds = wait_seconds
        self.retire_reason: RetireReason | None = None
        self._in_flight = False
        self._reusable = reusable  # False: the kernel is replaced after this lease anyway
        self.reset_pending: str | None = None
        """The ``last=True`` request after which the kernel resets itself, while it is the
        lease's last message (the pool waits for that reset's verdict)."""

    @property
    def kernel_id(self) -> str:
        return self._kernel.kernel_id

    @property
    def slot(self) -> str | None:
        """The GPU slot (``CUDA_VISIBLE_DEVICES`` value) the kernel was started with."""
        return self._kernel.slot

    @property
    def uses(self) -> int:
        """How many leases this kernel served before this one."""
        return self._kernel.uses

    @property
    def pid(self) -> int | None:
        return self._kernel.pid

    @property
    def identity(self) -> tuple[int, int] | None:
        """(uid, gid) the kernel runs as, when it runs as another user than the pool."""
        return self._kernel.identity

    def keep(self, path: str | os.PathLike[str]) -> None:
        """A folder handed to the kernel's uid (``identity``) that the caller removes
        itself: when the kernel ends, what its uid owns elsewhere in the shared folders is
        removed, and this is left alone."""
        self._kernel.keep(os.fspath(path))

    @property
    def in_flight(self) -> bool:
        """True while an execution is running (its end was not observed)."""
        return self._in_flight

    async def execute(
        self,
        code: str,
        *,
        deadline: float,
        silent: bool = False,
        store_history: bool = True,
        user_expressions: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        buffers: Sequence[bytes | memoryview] = (),
        on_output: OutputCallback | None = None,
        last: bool = False,
        stream_cap: int | None = None,
    ) -> ExecuteResult:
        """Execute ``code`` until ``deadline`` (a ``time.monotonic()`` value).

        Raises :class:`ExecutionTimeout` (after interrupt, grace and kill) or
        :class:`KernelDied`; either way the kernel is retired when the lease ends. If the
        caller is cancelled mid-execution the kernel is retired too.

        ``last=True`` says nothing else will run on this lease: the kernel resets itself
        right after replying (no second round trip, and off the caller's path) and goes
        back to the pool once its verdict arrives; a reset that finds anything retires it.

        ``stream_cap``: the kernel publishes at most this many characters of stdout and of
        stderr, and reports how many it dropped past them as one output of type
        :data:`~kernel_pool.STREAM_DROPPED_MSG_TYPE`, content ``{"stdout": n, "stderr": m}``.
        """
        reset_after = last and self._reusable
        with self._tracked():
            result = await self._kernel.execute(
                code,
                deadline=deadline,
                silent=silent,
                store_history=store_history,
                user_expressions=user_expressions,
                metadata=metadata,
                buffers=buffers,
                on_output=on_output,
                reset_after=reset_after,
                stream_cap=stream_cap,
            )
        if reset_after:
            self.reset_pending = result.msg_id
        return result

    async def send(
        self,
        msg_type: str,
        content: Mapping[str, Any],
        *,
        deadline: float,
        buffers: Sequence[bytes | memoryview] = (),
    ) -> tuple[Output, ...]:
        """Send a custom shell message (a comm message for in-kernel code, typically).

        Returns what the kernel published on IOPub in response, once it is idle again.
        """
        with self._tracked():
            return await self._kernel.send(msg_type, content, deadline=deadline, buffers=buffers)

    @contextlib.contextmanager
    def _tracked(self) -> Iterator[None]:
        """Mark a message in flight; a timeout or death marks the kernel for retirement.

        A block that does not complete (cancelled, or raising) leaves ``in_flight`` set, so
        the pool retires the kernel when the lease ends.
        """
        self._in_flight = True
        self.reset_pending = None  # whatever runs now comes after any earlier reset
        try:
            yield
        except ExecutionTimeout:
            self.retire(RetireReason.TIMEOUT)
            raise
        except KernelDied:
            self.retire(RetireReason.DIED)
            raise
        self._in_flight = False

    async def interrupt(self) -> None:
        """Send SIGINT to the kernel (the lease stays held)."""
        await self._kernel.interrupt()

    def retire(self, reason: RetireReason = RetireReason.REQUESTED) -> None:
        """Do not reuse this kernel: replace it when the lease ends."""
        if self.retire_reason is None:
            self.retire_reason = reason

    def memory_bytes(self) -> int:
        return self._kernel.memory_bytes()
