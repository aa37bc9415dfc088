"""One execution from admission to bundle, shared by every execute route.

Admission (a lease within ``--queue-wait``), the cell, cancellation (the cancel route or a
disconnected client set the execution's event; the running kernel is then retired), and
writing the bundle from the run directory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from kernel_pool import Lease, PoolBusy, PoolClosed, RetireReason

from .bundle import CellOutcome, write_bundle
from .envelopes import CellRequest
from .errors import Cancelled, WorkerBusy
from .execution import ConsoleListener, RunDir, run_cell
from .settings import Settings
from .state import Execution, WorkerState

CANCELLED_DETAIL = "execution was cancelled"


@contextlib.asynccontextmanager
async def admitted(state: WorkerState, build_id: str | None) -> AsyncIterator[Execution]:
    """Count the execution as active (and cancellable by build id) while it runs."""
    execution = Execution(build_id)
    state.executions.append(execution)
    try:
        yield execution
    finally:
        state.executions.remove(execution)


async def execute_to_bundle(
    state: WorkerState,
    cell: CellRequest,
    run_dir: RunDir,
    execution: Execution,
    *,
    console: ConsoleListener | None = None,
) -> Path:
    """Lease a kernel, run the cell and write the bundle; return the bundle's path."""
    if execution.cancel.is_set():
        raise Cancelled(CANCELLED_DETAIL)
    try:
        lease_cm = state.pool.lease(wait_seconds=state.settings.queue_wait_seconds)
        async with lease_cm as lease:
            outcome = await _run_cancellable(lease, cell, run_dir, state, execution, console)
    except (PoolBusy, PoolClosed) as exc:
        raise WorkerBusy(_busy_detail(state, exc)) from None
    bundle = run_dir.root / "bundle.tar.gz"
    await asyncio.to_thread(_write, run_dir, outcome, bundle, state.settings)
    return bundle


async def _run_cancellable(
    lease: Lease,
    cell: CellRequest,
    run_dir: RunDir,
    state: WorkerState,
    execution: Execution,
    console: ConsoleListener | None,
) -> CellOutcome:
    run = asyncio.ensure_future(run_cell(lease, cell, run_dir, state.context, console=console))
    cancelled = asyncio.ensure_future(execution.cancel.wait())
    try:
        await asyncio.wait({run, cancelled}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        cancelled.cancel()
        if not run.done():
            lease.retire(RetireReason.CANCELLED)  # the kernel is killed, never reused
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
    if run.cancelled():
        raise Cancelled(CANCELLED_DETAIL)
    return run.result()


def _busy_detail(state: WorkerState, exc: Exception) -> str:
    if isinstance(exc, PoolClosed):
        return "Worker is shutting down"
    size = state.settings.pool_size
    return f"All {size} kernels are busy (waited {state.settings.queue_wait_seconds:g}s)"


def _write(run_dir: RunDir, outcome: CellOutcome, bundle: Path, settings: Settings) -> None:
    with open(bundle, "wb") as fh:
        write_bundle(run_dir.root, outcome, fh, compresslevel=settings.bundle_compresslevel)
