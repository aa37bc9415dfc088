"""The worker's shared state, created once per application."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from kernel_pool import Pool, PoolSet

from .errors import WorkerBusy
from .execution import ExecutionContext
from .jobs import Execution, JobQueue
from .languages import RKernels
from .settings import Settings
from .tracing import OFF, Tracing

if TYPE_CHECKING:
    from .environments.kernels import LockedKernels
    from .memory_watch import MemoryWatch
    from .metrics import WorkerMetrics
    from .mounts.cache import MountCache
    from .runs.reuse import ReusableFiles


@dataclass(slots=True)
class WorkerState:
    """Everything a request handler needs."""

    settings: Settings
    pool: Pool
    context: ExecutionContext
    jobs: JobQueue
    metrics: WorkerMetrics
    mount_cache: MountCache
    pools: PoolSet
    """The default pool (``pool``) and one per locked environment in use."""
    environments: LockedKernels
    memory: MemoryWatch
    """The pools' memory, measured in the background (never by a probe)."""
    r_kernels: RKernels = field(default_factory=lambda: RKernels(enabled=False))
    """R cells: whether they run here, and the kind of kernel that runs them."""
    started_at: float = field(default_factory=time.monotonic)
    executions: list[Execution] = field(default_factory=list)
    uploads: int = 0
    """Push-model request bodies being received (at most ``max_uploads``)."""
    draining: bool = False
    withdrawn: bool = False
    """SIGTERM came: ``/ready`` answers 503 (``--drain-notice``), though cells are still taken
    until the drain begins."""
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    # set by SIGTERM/SIGINT: a pool still starting (a long preload) stops starting
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event)
    # the CLI's: ends the server after a start-up failure it reports itself (one line, not
    # a framework traceback); without it (an app served some other way) the failure raises
    end_server: Callable[[], None] | None = None
    startup_failure: str | None = None
    # the one client for pull-model transfers; opened and closed by the app's lifespan
    http_client: httpx.AsyncClient | None = None
    tracing: Tracing = OFF
    """Where requests' spans go (see :mod:`kernel_worker.tracing`); off by default."""

    @property
    def reusable_files(self) -> ReusableFiles | None:
        """Large files of finished runs, for later inputs and outputs (None: off, or not a
        memory run root); the execution context's."""
        return self.context.reuse

    @property
    def active_executions(self) -> int:
        return len(self.executions)

    def admit(self, build_id: str | None) -> Execution:
        """Count an execution as active (and cancellable by build id) until discharged."""
        if self.draining:
            raise WorkerBusy("Worker is shutting down")
        limit = self.settings.max_concurrent
        if limit is not None and len(self.executions) >= limit:
            raise WorkerBusy(f"Worker is running {len(self.executions)} of {limit} executions")
        execution = Execution(build_id)
        self.executions.append(execution)
        return execution

    @contextlib.contextmanager
    def receiving_upload(self) -> Iterator[None]:
        """Hold one of the ``max_uploads`` slots while a request body is received.

        Raises:
            WorkerBusy: Every slot is taken (``503`` + ``Retry-After``): the bodies already
                coming in hold their run directories, in memory by default.
        """
        limit = self.settings.max_uploads
        if self.uploads >= limit:
            raise WorkerBusy(f"Worker is receiving {self.uploads} of {limit} uploads")
        self.uploads += 1
        try:
            yield
        finally:
            self.uploads -= 1

    def discharge(self, execution: Execution) -> None:
        self.executions.remove(execution)
        if not self.executions:
            self.idle.set()

    async def drain(self, timeout_seconds: float, stop: asyncio.Event | None = None) -> bool:
        """Refuse new executions; wait for those admitted to end, and for the results of
        those answered ``202`` that a client is polling for to be collected, for at most
        ``timeout_seconds`` and not after ``stop`` is set. True if nothing was left."""
        self.draining = True
        if self.settled:
            return True
        waits: set[asyncio.Future[object]] = {asyncio.ensure_future(self._settle())}
        if stop is not None:
            waits.add(asyncio.ensure_future(stop.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout_seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return self.settled

    @property
    def settled(self) -> bool:
        return not self.executions and not self.jobs.uncollected

    async def _settle(self) -> None:
        if self.executions:
            self.idle.clear()
            await self.idle.wait()
        await self.jobs.collected()  # a poll collects each (Strata's client polls every 1 s)

    def cancel_all(self) -> int:
        """Cancel every admitted execution (a drain that ran out of time); how many."""
        for execution in self.executions:
            execution.cancel.set()
        return len(self.executions)

    def cancel(self, build_id: str) -> bool:
        """Flag every execution of ``build_id`` as cancelled; True if one was running."""
        found = [e for e in self.executions if e.build_id == build_id and e.stoppable]
        for execution in found:
            execution.cancel.set()
        return bool(found)
