"""One execution from admission to bundle, shared by every execute route.

Admission (a job, waiting for a kernel as long as it is queued), the cell, cancellation
(the cancel route or a disconnected client set the execution's event; a running kernel is
then retired), and writing the bundle from the run directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from kernel_pool import PoolClosed

from .bundle import CellOutcome, write_bundle
from .envelopes import CellRequest
from .errors import Cancelled, CellTimedOut, KernelCrashed, WorkerBusy
from .execution import ConsoleListener, RunDir, run_cell
from .jobs import Job
from .settings import Settings
from .state import Execution, WorkerState

CANCELLED_DETAIL = "execution was cancelled"


@contextlib.asynccontextmanager
async def admitted(state: WorkerState, build_id: str | None) -> AsyncIterator[Execution]:
    """Count an execution as active (and cancellable by build id) while the block runs."""
    execution = state.admit(build_id)
    try:
        yield execution
    finally:
        state.discharge(execution)


def submit(
    state: WorkerState,
    cell: CellRequest,
    run_dir: RunDir,
    *,
    console: ConsoleListener | None = None,
) -> Job:
    """Admit ``cell`` as a job (raises :class:`WorkerBusy` when the queue is full)."""
    execution = state.admit(cell.build_id)

    async def runner(job: Job) -> Path:
        try:
            return await execute_to_bundle(
                state, cell, run_dir, execution, console=console, on_start=job.mark_running
            )
        finally:
            state.discharge(execution)

    try:
        return state.jobs.submit(execution, run_dir, runner)
    except BaseException:
        state.discharge(execution)
        raise


async def execute_to_bundle(
    state: WorkerState,
    cell: CellRequest,
    run_dir: RunDir,
    execution: Execution,
    *,
    console: ConsoleListener | None = None,
    on_start: Callable[[], None] | None = None,
) -> Path:
    """Lease a kernel (waiting as long as needed), run the cell, write the bundle."""

    async def body() -> Path:
        try:
            async with state.pool.lease() as lease:
                if on_start is not None:
                    on_start()
                with _observed(state) as observe:
                    outcome = await run_cell(lease, cell, run_dir, state.context, console=console)
                    observe("success" if outcome.success else "cell_error")
        except PoolClosed:
            raise WorkerBusy("Worker is shutting down") from None
        bundle = run_dir.root / "bundle.tar.gz"
        size = await asyncio.to_thread(_write, run_dir, outcome, bundle, state.settings)
        state.metrics.bytes_out.inc(size)
        return bundle

    work = asyncio.ensure_future(body())
    cancelled = asyncio.ensure_future(execution.cancel.wait())
    try:
        await asyncio.wait({work, cancelled}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        cancelled.cancel()
        if not work.done():
            work.cancel()  # a lease cancelled mid-execution retires its kernel
            with contextlib.suppress(asyncio.CancelledError):
                await work
    if work.cancelled():
        raise Cancelled(CANCELLED_DETAIL)
    return work.result()


@contextlib.contextmanager
def _observed(state: WorkerState) -> Iterator[Callable[[str], None]]:
    """Time one execution into the histogram, labelled by how it ended."""
    started = time.monotonic()
    outcome = "cancelled"

    def observe(label: str) -> None:
        nonlocal outcome
        outcome = label

    try:
        yield observe
    except CellTimedOut:
        outcome = "timeout"
        raise
    except KernelCrashed:
        outcome = "kernel_died"
        raise
    finally:
        state.metrics.executions.labels(outcome).observe(time.monotonic() - started)


def _write(run_dir: RunDir, outcome: CellOutcome, bundle: Path, settings: Settings) -> int:
    with open(bundle, "wb") as fh:
        return write_bundle(run_dir.root, outcome, fh, compresslevel=settings.bundle_compresslevel)
