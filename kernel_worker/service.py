"""One execution from admission to bundle, shared by every execute route.

Admission (a job, waiting for a kernel as long as it is queued), the cell, cancellation
(the cancel route or a disconnected client set the execution's event; a running kernel is
then retired), and handing on the bundle: the cell's :class:`BundlePlan` is computed once,
and a :data:`Deliver` turns it into what the route sends (bytes or a stream, push runs) or a
file (pull runs, whose uploads stream from disk).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from kernel_pool import KernelKind, KernelStartError, Lease, PoolClosed

from .cancellation import unless_cancelled
from .environments import LockedEnvironmentError
from .environments.kernels import PreparedKind
from .errors import (
    CellTimedOut,
    EnvironmentFailed,
    KernelCrashed,
    LanguageUnavailable,
    WorkerBusy,
    storage_checked,
)
from .execution import ConsoleListener, run_cell
from .jobs import Execution, Job, JobResult
from .languages import run_r_cell
from .mounts.materialize import materialize, sync_back
from .protocol.bundle import BundlePlan, CellOutcome, plan_bundle
from .protocol.envelopes import CellRequest
from .protocol.streaming import BundleStream
from .runs.directory import SMALL_IO_BYTES, RunDir, offload
from .runs.reuse import ReusableFiles, new_file
from .state import WorkerState
from .tracing import Attributes

_UNTRACED = contextlib.nullcontext()

log = logging.getLogger(__name__)


def _type_name(name: str | None) -> str:
    """An exception's class name for the log, when it looks like one (it is the cell's)."""
    if name and len(name) <= 80 and all(part.isidentifier() for part in name.split(".")):
        return name
    return "an error"


CANCELLED_DETAIL = "execution was cancelled"
BUILDING_ENVIRONMENT = "building environment"
"""The phase of an execution whose locked environment is being built (or looked up)."""
AfterCell = Callable[[CellOutcome], Awaitable[CellOutcome]]
"""Adjusts a finished cell's outcome before it is bundled (e.g. files sent elsewhere)."""
IN_MEMORY_BUNDLE_BYTES = 1024 * 1024
"""A push run's bundle with less content than this is sent as bytes, a larger one streamed."""
_T = TypeVar("_T")
Deliver = Callable[[BundlePlan], _T]
"""Turns a cell's bundle plan into what its caller hands on (blocking: it writes)."""


def submit(state: WorkerState, cell: CellRequest, run_dir: RunDir) -> Job:
    """Admit a push-model ``cell`` as a job whose result is its bundle."""

    async def work(execution: Execution, job: Job) -> JobResult:
        deliver = in_memory_or_streamed(state.metrics.bytes_out.inc)
        return await execute_to_bundle(
            state, cell, run_dir, execution, deliver,
            console=execution.console.append, on_start=job.mark_running,
        )  # fmt: skip

    return submit_work(state, cell.build_id, run_dir, work)


def submit_work(
    state: WorkerState,
    build_id: str | None,
    run_dir: RunDir,
    work: Callable[[Execution, Job], Awaitable[JobResult]],
) -> Job:
    """Admit ``work`` as a job (raises :class:`WorkerBusy` when the queue is full).

    The execution counts as active, and can be cancelled by ``build_id``, until it ends.
    """
    execution = state.admit(build_id)

    async def runner(job: Job) -> JobResult:
        try:
            return await work(execution, job)
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
    deliver: Deliver[_T],
    *,
    console: ConsoleListener | None = None,
    on_start: Callable[[], None] | None = None,
    after_cell: AfterCell | None = None,
) -> _T:
    """Lease a kernel (waiting as long as needed), run the cell, plan its bundle once and
    hand the plan to ``deliver`` (see :func:`in_memory_or_streamed`, :func:`to_file`)."""

    async def body() -> _T:
        # an R cell runs on the R kernels' pool (raises where R cells cannot run here)
        r_kind = state.r_kernels.kind_for(cell.environment) if cell.language == "r" else None
        # the environment is built (or found) before a kernel is held: not in the cell's time
        prepared = await _prepared_environment(state, cell, execution) if r_kind is None else None
        kind = prepared.kind if prepared is not None else r_kind
        run = run_cell if r_kind is None else run_r_cell
        # remote data is fetched before a kernel is held, and synced back after it is free
        with state.tracing.step("worker.mounts") if cell.mounts else _UNTRACED:
            mounted = await materialize(cell.mounts, run_dir.root, state.mount_cache)
        waiting = state.tracing.begin("worker.lease")  # in the queue, until a kernel is ours
        try:
            async with state.pools.lease(kind) as lease:
                waiting.end()
                state.tracing.annotate(_kernel_attributes(state, lease, kind))
                if on_start is not None:
                    on_start()
                with _observed(state) as observe, state.tracing.step("worker.run_cell"):
                    outcome = await run(
                        lease, cell, run_dir, state.context, console=console, mounts=mounted.paths
                    )
                    observe("success" if outcome.success else "cell_error")
                if not outcome.success:  # the exception's type only: its message may hold data
                    log.info("the cell raised %s", _type_name(outcome.error_type))
        except PoolClosed:
            raise WorkerBusy("Worker is shutting down") from None
        except KernelStartError as exc:  # only an environment's (or R's) new pool starts here
            if r_kind is not None:
                raise LanguageUnavailable(f"the R kernels could not start: {exc}") from None
            raise EnvironmentFailed(f"its kernels could not start: {exc}") from None
        finally:
            waiting.end()
        if outcome.success:
            writes = await sync_back(cell.mounts, mounted) if cell.mounts else []
            outcome = replace(outcome, mount_bytes=dict(mounted.mount_bytes), mount_writes=writes)
        if prepared is not None:  # the environment it ran in, for the bundle's reader
            built = prepared.environment
            outcome = replace(
                outcome, environment={"key": built.dir_key, "installed": built.installed}
            )
        if after_cell is not None:
            outcome = await after_cell(outcome)
        # a few small files on a memory-backed run dir: cheaper to bundle than to hand over
        inline = state.context.inline_io and not outcome.output_dirs
        level = state.settings.bundle_compresslevel
        with storage_checked("the cell's bundle"), state.tracing.step("worker.bundle") as span:
            plan = await offload(inline, plan_bundle, run_dir.root, outcome, level)
            span.set("worker.bundle.payload_bytes", plan.payload)
            return await offload(inline and plan.payload <= SMALL_IO_BYTES, deliver, plan)

    # the cancel route or a client gone: the lease is cancelled, its kernel retired
    return await unless_cancelled(body(), execution.cancel, CANCELLED_DETAIL)


def in_memory_or_streamed(on_bytes: Callable[[int], object]) -> Deliver[bytes | BundleStream]:
    """A push run's bundle: bytes under :data:`IN_MEMORY_BUNDLE_BYTES` of content (no file
    to write, stat and send back), else a :class:`BundleStream` that writes it while it is
    sent, with its length when known up front (then not chunked). ``on_bytes`` is told
    every byte produced."""

    def deliver(plan: BundlePlan) -> bytes | BundleStream:
        if plan.payload < IN_MEMORY_BUNDLE_BYTES:
            data = plan.to_bytes()
            on_bytes(len(data))
            return data
        return BundleStream(plan.write, length=plan.length, on_bytes=on_bytes)

    return deliver


def to_file(
    run_dir: RunDir, reuse: ReusableFiles | None, on_bytes: Callable[[int], object]
) -> Deliver[Path]:
    """The bundle written to ``run_dir.bundle_file`` (a stored bundle's length is known up
    front: a kept file of ``reuse`` that fits it can take it). ``on_bytes`` is told its
    size."""

    def deliver(plan: BundlePlan) -> Path:
        path = run_dir.bundle_file
        expected = plan.length if reuse is not None else None
        with new_file(path, reuse, expected) as fh:
            written = plan.write(fh)
            fh.truncate()  # over a kept file: cut at what was written
        on_bytes(written)
        return path

    return deliver


async def _prepared_environment(
    state: WorkerState, cell: CellRequest, execution: Execution
) -> PreparedKind | None:
    """The locked environment ``cell`` runs in, built first where needed, and its kind of
    kernel; ``None`` for the worker's own environment. A poll meanwhile says so (phase)."""
    if cell.environment is None:
        return None
    execution.phase = BUILDING_ENVIRONMENT
    try:
        with state.tracing.step("worker.environment"):
            return await state.environments.prepare(cell.environment)
    except LockedEnvironmentError as exc:
        raise EnvironmentFailed(str(exc)) from None
    finally:
        execution.phase = None


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
        state.tracing.annotate({"worker.outcome": outcome})


def _kernel_attributes(state: WorkerState, lease: Lease, kind: KernelKind | None) -> Attributes:
    """The kernel a cell runs on, for its trace."""
    return {
        "worker.kernel.id": lease.kernel_id,
        "worker.kernel.pid": lease.pid,
        "worker.kernel.kind": (kind or state.pool.config.kind).name,
        "worker.kernel.uses": lease.uses,
        "worker.kernel.gpu_slot": lease.slot,
        "worker.lease.wait_seconds": round(lease.wait_seconds, 6),
    }


async def execute_to_bundle_file(
    state: WorkerState,
    cell: CellRequest,
    run_dir: RunDir,
    execution: Execution,
    *,
    console: ConsoleListener | None = None,
    after_cell: AfterCell | None = None,
    on_start: Callable[[], None] | None = None,
) -> Path:
    """:func:`execute_to_bundle`, always as a file (for uploads that stream from disk)."""
    deliver = to_file(run_dir, state.context.reuse, state.metrics.bytes_out.inc)
    return await execute_to_bundle(
        state, cell, run_dir, execution, deliver, console=console, after_cell=after_cell,
        on_start=on_start,
    )  # fmt: skip
