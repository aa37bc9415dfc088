"""The warm pool: warm-up, leasing, background reset, retirement and refill.

Invariants:
- a lease only ever gets a kernel in state IDLE, which no one else holds;
- every lease ends in exactly one of: reset and reused, or retired (killed in the
  background and replaced). The reset runs in the kernel right after the lease's last cell
  replied when the caller says which cell is last (``execute(..., last=True)``), else as a
  separate request in the background;
- the pool never runs more than ``config.target_kernels`` kernels, and never restarts in a
  tight loop (failed starts back off exponentially).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from .backoff import StartBackoff
from .config import PoolConfig, RecyclePolicy
from .errors import KernelStartError, PoolBusy, PoolClosed, PoolError
from .forkserver import ForkServer
from .kernel import Kernel, KernelState
from .kinds import write_kernelspec
from .lease import Lease, RetireReason
from .memory import PoolMemory, process_memory
from .private_dir import PrivateDir
from .stats import PoolStats, StatsRecorder
from .tasks import PoolTasks, finish
from .uids import KernelUids, uids_of

log = logging.getLogger(__name__)


class Pool:
    """A pool of warm kernels. Use ``await pool.start()`` then ``async with pool.lease()``."""

    def __init__(
        self,
        config: PoolConfig,
        *,
        uids_elsewhere: Callable[[], set[int]] | None = None,
        fork_server: ForkServer | None = None,
    ) -> None:
        """``uids_elsewhere``: with ``kernel_uids``, the uids of the range that kernels of
        other pools hold (pools sharing one range never give one uid to two kernels).
        ``fork_server``: a template shared with other pools (the kind's ``template``),
        which the pool uses and leaves running; else it makes its own if the kind forks."""
        self.config = config
        self._uids = KernelUids(config.kernel_uids, self.held_uids, uids_elsewhere)
        self._kernels: dict[str, Kernel] = {}
        self._idle: deque[Kernel] = deque()
        self._available = asyncio.Condition()
        self._lease_slots = asyncio.Semaphore(config.size)
        self._free_slots: list[str | None] = self._initial_slots()
        self._tasks = PoolTasks(log)
        self._retiring: set[Kernel] = set()  # retired, not killed yet
        self._refill_wanted = asyncio.Event()
        self._backoff = StartBackoff(config.restart_backoff_seconds, log)
        self._closing = asyncio.Event()
        self._leases_done = asyncio.Event()
        self._leased = 0
        self._started = False
        self._private_dir = PrivateDir()
        self._kernel_dirs: list[Path] = []
        self._fork_server: ForkServer | None = fork_server
        self._owns_fork_server = fork_server is None and config.kind.forks
        if self._owns_fork_server:
            env = config.env if config.env is not None else os.environ
            self._fork_server = ForkServer(env, config.kind.template)
        self._stats = StatsRecorder()

    def _initial_slots(self) -> list[str | None]:
        slots = self.config.gpu_slots
        n = self.config.target_kernels
        if not slots:
            return [None] * n
        return [slots[i % len(slots)] for i in reversed(range(n))]

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every kernel concurrently; raise the first failure.

        A start that fails or is cancelled closes the pool before it ends: no kernel, fork
        server or private folder outlives it.
        """
        if self._started:
            raise PoolError("pool already started")
        self._started = True
        try:
            await self._start_kernels()
        except BaseException:
            await finish(self.aclose())
            raise
        self._tasks.spawn(self._refill_loop())

    async def _start_kernels(self) -> None:
        parent = Path(self.config.runtime_dir or tempfile.gettempdir())
        other_users = bool(self.config.kernel_user or self.config.kernel_uids)
        private_dir = await self._private_dir.create(parent, other_users=other_users)
        self._kernel_dirs = [write_kernelspec(self.config.kind, private_dir)]
        results = await asyncio.gather(
            *(self._start_one() for _ in range(self.config.target_kernels)),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def aclose(self) -> None:
        """Stop leasing, wait briefly for leases in flight, stop every kernel, clean up.

        Cancelled, it hurries instead of stopping half-way: the background tasks are
        cancelled and the kernels killed rather than waited for, the fork server and the
        private folder go, and only then is the cancellation raised.
        """
        if self._closing.is_set():
            return
        self._closing.set()
        try:
            await self._close_gracefully()
        except BaseException:
            await finish(self._close_now())
            raise
        finally:
            await finish(self._release_resources())

    async def _close_gracefully(self) -> None:
        async with self._available:
            self._available.notify_all()
        if self._leased:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._leases_done.wait(), self.config.shutdown_timeout_seconds
                )
        self._refill_wanted.set()  # the refill loop sees the pool closing, and ends
        await self._tasks.drain(time.monotonic() + self.config.shutdown_timeout_seconds)
        kernels = list(self._kernels.values())
        for _ in kernels:
            self._stats.retired(RetireReason.SHUTDOWN)
        killed = list(self._retiring)  # their kill tasks were cancelled by the drain
        await asyncio.gather(
            *(k.shutdown() for k in kernels), *(k.kill() for k in killed), return_exceptions=True
        )
        self._kernels.clear()
        self._idle.clear()
        self._retiring.clear()

    async def _close_now(self) -> None:
        """What a cancelled close still does: every background task cancelled and ended,
        every kernel killed."""
        await self._tasks.cancel_all()
        kernels = [*self._kernels.values(), *self._retiring]
        self._kernels.clear()
        self._idle.clear()
        self._retiring.clear()
        await asyncio.gather(*(k.kill() for k in kernels), return_exceptions=True)

    async def _release_resources(self) -> None:
        if self._fork_server is not None and self._owns_fork_server:
            await self._fork_server.aclose()
        await self._private_dir.remove()

    async def __aenter__(self) -> Pool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- leasing ---------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lease(self, *, wait_seconds: float | None = None) -> AsyncIterator[Lease]:
        """Exclusive use of one ready kernel.

        Waits up to ``wait_seconds`` (forever if ``None``) for one; raises :class:`PoolBusy`
        then, or :class:`PoolClosed` once the pool is closing.
        """
        started = time.monotonic()
        kernel = await self._acquire(None if wait_seconds is None else started + wait_seconds)
        lease = Lease(kernel, time.monotonic() - started, reusable=self._reusable(kernel))
        self._stats.leased(lease.wait_seconds)
        try:
            yield lease
        except BaseException:
            if lease.in_flight:
                lease.retire(RetireReason.CANCELLED)
            raise
        finally:
            self._release(kernel, lease)

    async def _acquire(self, deadline: float | None) -> Kernel:
        if self._closing.is_set() or not self._started:
            raise PoolClosed("the pool is not accepting leases")
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            await asyncio.wait_for(self._lease_slots.acquire(), timeout)
        except TimeoutError:
            raise PoolBusy(f"all {self.config.size} kernels are busy") from None
        try:
            kernel = await self._take_idle(deadline)
        except BaseException:
            self._lease_slots.release()
            raise
        kernel.state = KernelState.BUSY
        self._leased += 1
        self._leases_done.clear()
        return kernel

    async def _take_idle(self, deadline: float | None) -> Kernel:
        def ready() -> bool:
            return bool(self._idle) or self._closing.is_set()

        async with self._available:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait_for(self._available.wait_for(ready), timeout)
            except TimeoutError:
                raise PoolBusy("no warm kernel became ready in time") from None
            if self._closing.is_set():
                raise PoolClosed("the pool is shutting down")
            return self._idle.pop()  # dead kernels never stay here: see _on_kernel_death

    def _release(self, kernel: Kernel, lease: Lease) -> None:
        """End a lease without awaiting: the reset or retirement runs in the background."""
        kernel.uses += 1
        self._leased -= 1
        if not self._leased:
            self._leases_done.set()
        self._lease_slots.release()
        reason = self._retire_reason(kernel, lease)
        if reason is not None:
            self._retire(kernel, reason)
            return
        kernel.state = KernelState.RESETTING
        if lease.reset_pending is not None:
            self._tasks.spawn(self._return_after_inline_reset(kernel, lease.reset_pending))
        else:
            self._tasks.spawn(self._reset_and_return(kernel))

    def _reusable(self, kernel: Kernel) -> bool:
        """Whether ``kernel`` may serve another lease after the next one (policy only)."""
        if self.config.recycle is RecyclePolicy.FRESH:
            return False
        max_uses = self.config.max_uses
        return max_uses is None or kernel.uses + 1 < max_uses

    def _retire_reason(self, kernel: Kernel, lease: Lease) -> RetireReason | None:
        if lease.retire_reason is not None:
            return lease.retire_reason
        if kernel.died.is_set():
            return RetireReason.DIED
        if self._closing.is_set():
            return RetireReason.SHUTDOWN
        if self.config.recycle is RecyclePolicy.FRESH:
            return RetireReason.FRESH_POLICY
        if self.config.max_uses is not None and kernel.uses >= self.config.max_uses:
            return RetireReason.MAX_USES
        return None

    async def _reset_and_return(self, kernel: Kernel) -> None:
        started = time.monotonic()
        try:
            problems = await kernel.reset(started + self.config.reset_timeout_seconds)
        except PoolError as exc:
            problems = [f"reset did not complete: {exc}"]
        self._stats.reset_done(time.monotonic() - started)
        await self._return_if_clean(kernel, problems)

    async def _return_after_inline_reset(self, kernel: Kernel, msg_id: str) -> None:
        """The kernel resets itself after the lease's last cell: wait for its verdict, add
        what it cannot see from inside (processes it started), judge it like a full reset."""
        deadline = time.monotonic() + self.config.reset_timeout_seconds
        inline = await kernel.reset_verdict(msg_id, deadline)
        if inline is None:  # died, or no verdict came: the full reset decides
            await self._reset_and_return(kernel)
            return
        self._stats.reset_done(inline.seconds, inline=True)
        kernel.keep_library_processes(inline.library_processes)
        await self._return_if_clean(kernel, [*inline.problems, *kernel.stray_problems()])

    async def _return_if_clean(self, kernel: Kernel, problems: list[str]) -> None:
        if kernel.died.is_set():
            self._retire(kernel, RetireReason.DIED)
        elif problems:
            log.warning(
                "kernel %s not clean after reset: %s", kernel.kernel_id, "; ".join(problems)
            )
            self._retire(kernel, RetireReason.FAILED_RESET)
        elif self._over_memory(kernel):
            self._retire(kernel, RetireReason.MEMORY)
        else:
            await self._make_idle(kernel)

    def _over_memory(self, kernel: Kernel) -> bool:
        limit = self.config.max_kernel_memory
        return limit is not None and kernel.memory_bytes() > limit

    async def _make_idle(self, kernel: Kernel) -> None:
        if self._closing.is_set():
            self._retire(kernel, RetireReason.SHUTDOWN)
            return
        kernel.state = KernelState.IDLE
        async with self._available:
            self._idle.append(kernel)
            self._available.notify()

    # -- retirement and refill ------------------------------------------------------------------

    def _retire(self, kernel: Kernel, reason: RetireReason) -> None:
        log.info("retiring kernel %s: %s", kernel.kernel_id, reason.value)
        kernel.state = KernelState.RETIRING
        self._kernels.pop(kernel.kernel_id, None)
        with contextlib.suppress(ValueError):
            self._idle.remove(kernel)
        self._free_slots.append(kernel.slot)
        self._stats.retired(reason)
        self._retiring.add(kernel)
        self._tasks.spawn(self._kill_retired(kernel))
        self._refill_wanted.set()
        self._replace_now()

    def _replace_now(self) -> None:
        """Start a retired kernel's replacement at once: counted as starting from now, so
        that nothing (``/health``) sees the pool with no kernel while one is owed. Left to
        the refill loop while the pool closes, while starts fail (it waits them out), or
        while no uid is free."""
        if (
            self._closing.is_set()
            or self._backoff.backing_off
            or len(self._kernels) >= self.config.target_kernels
            or self._waiting_for_a_uid()
        ):
            return
        try:
            kernel = self._add_kernel()
        except Exception:  # the refill loop tries again, and counts the failure
            return
        self._tasks.spawn(self._refill_one(kernel), start=True)

    async def _kill_retired(self, kernel: Kernel) -> None:
        """Kill a retired kernel (until this runs, closing the pool kills it instead)."""
        try:
            await kernel.kill()
        finally:
            self._retiring.discard(kernel)
            self._refill_wanted.set()  # its uid is free now (a refill may wait for it)

    def _on_kernel_death(self, kernel: Kernel) -> None:
        """A kernel nobody holds died (e.g. a cell asked it to exit): replace it now."""
        if kernel.state is KernelState.IDLE and kernel.kernel_id in self._kernels:
            self._retire(kernel, RetireReason.DIED)

    def _add_kernel(self) -> Kernel:
        """A kernel not started yet, counted in the pool from now on (it holds a slot)."""
        assert self._private_dir.path is not None
        slot = self._free_slots.pop()
        try:
            uid = self._uids.free()
            kernel = Kernel(
                self.config,
                self._private_dir.path,
                self._kernel_dirs,
                slot,
                on_death=self._on_kernel_death,
                fork_server=self._fork_server,
                identity=(uid, uid) if uid is not None else None,
            )
        except BaseException:
            self._free_slots.append(slot)
            raise
        self._kernels[kernel.kernel_id] = kernel
        return kernel

    async def _start_one(self, kernel: Kernel | None = None) -> Kernel:
        kernel = kernel if kernel is not None else self._add_kernel()
        try:
            await kernel.start()
        except BaseException as exc:
            self._kernels.pop(kernel.kernel_id, None)
            self._free_slots.append(kernel.slot)
            if isinstance(exc, KernelStartError):
                self._stats.start_failed(str(exc))
            raise
        assert kernel.start_seconds is not None
        self._stats.started(kernel.start_seconds)
        await self._make_idle(kernel)
        return kernel

    async def _refill_loop(self) -> None:
        """Start a replacement for each kernel that leaves, as soon as it leaves.

        Each start is a task of its own: a kernel retired while others are starting is
        replaced at once, not after them (kills coming faster than one start takes would
        otherwise drain the pool). Kernels still starting count as present, so the pool
        never runs more than its target. After a failed start the next round of starts
        waits, twice as long each time in a row, up to the configured largest delay.
        """
        while not self._closing.is_set():
            await self._refill_wanted.wait()
            self._refill_wanted.clear()
            await self._backoff.wait_out(self._closing)
            for _ in range(self.config.target_kernels - len(self._kernels)):
                if self._closing.is_set():
                    break
                if self._waiting_for_a_uid():  # the retiring kernel's end wakes us up
                    break
                try:  # counted at once: a wake-up before it starts must not add another
                    kernel = self._add_kernel()
                except Exception as exc:
                    self._start_failed(exc)
                    break
                self._tasks.spawn(self._refill_one(kernel), start=True)

    async def _refill_one(self, kernel: Kernel) -> None:
        try:
            await self._start_one(kernel)
        except Exception as exc:
            self._start_failed(exc)
        else:
            self._backoff.succeeded()

    def _start_failed(self, exc: BaseException) -> None:
        """Counted, logged by the refill loop, and retried after a delay."""
        if not isinstance(exc, KernelStartError):  # those are counted where they are raised
            self._stats.start_failed(f"{type(exc).__name__}: {exc}")
        self._backoff.failed(exc)
        self._refill_wanted.set()

    # -- introspection ---------------------------------------------------------------------------

    def stats(self) -> PoolStats:
        """A snapshot for health checks and metrics."""
        states = Counter(k.state.value for k in self._kernels.values())
        return self._stats.snapshot(
            config=self.config,
            states={s.value: states.get(s.value, 0) for s in KernelState},
            uses={k.kernel_id: k.uses for k in self._kernels.values()},
            closing=self._closing.is_set(),
            busy_slots=tuple(
                k.slot
                for k in self._kernels.values()
                if k.state is KernelState.BUSY and k.slot is not None
            ),
        )

    @property
    def private_dir(self) -> Path | None:
        """The pool's private (0700) directory holding connection files."""
        return self._private_dir.path

    def memory(self) -> PoolMemory:
        """Each live kernel's memory, and the template's (the fork server holds the
        preload every forked kernel shares)."""
        kernels = {k.kernel_id: process_memory(k.pid) for k in list(self._kernels.values())}
        server = self._fork_server.pid if self._fork_server is not None else None
        return PoolMemory(
            template=process_memory(server),
            kernels={kernel: memory for kernel, memory in kernels.items() if memory is not None},
        )

    def held_uids(self) -> set[int]:
        """The uids of ``kernel_uids`` that this pool's kernels hold, a retired kernel's
        until it is torn down (its processes killed, what its uid left removed): a uid
        goes to a new kernel only after that."""
        return uids_of([*self._kernels.values(), *self._retiring])

    def _waiting_for_a_uid(self) -> bool:
        """Every uid of the range is held, one by a kernel being torn down."""
        return bool(self._retiring) and self._uids.all_held()

    def kernel_pids(self) -> dict[str, int | None]:
        """Process ids of the live kernels (for diagnostics and tests)."""
        return {k.kernel_id: k.pid for k in self._kernels.values()}
