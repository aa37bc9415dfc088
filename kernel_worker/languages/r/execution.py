"""One R cell on a leased R kernel: plan → one execute_request → outcome.

The worker prepares the run (inputs R cannot read itself, the plan file), the kernel runs
one fixed line that reads the plan, runs the cell and writes its outputs and a report, and
the worker turns the report into the bundle's variables and displays (data frames into
Arrow). The console streams from the kernel as the cell prints, as for Python cells; the
lease's rules (timeout, cancel, retirement) are the same.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kernel_pool import ExecuteResult, Lease

from ...execution import ConsoleListener, ExecutionContext, kernel_failures
from ...protocol.bundle import CellOutcome
from ...protocol.envelopes import CellRequest
from ...runs import layout as run_layout
from ...runs import output_dirs
from ...runs.directory import RunDir, hand_over
from ...runs.display_files import mime_files
from ...runs.messages import OutputReducer
from . import outputs
from .plan import write_plan
from .runtime import run_call

__all__ = ["run_r_cell"]

log = logging.getLogger(__name__)


async def run_r_cell(
    lease: Lease,
    request: CellRequest,
    run_dir: RunDir,
    context: ExecutionContext,
    *,
    console: ConsoleListener | None = None,
    mounts: Mapping[str, str] | None = None,
) -> CellOutcome:
    """Run the R cell; raise :class:`CellTimedOut` or :class:`KernelCrashed` when it cannot
    end (see :func:`kernel_worker.execution.run_cell`, whose arguments it takes)."""
    folders = output_dirs.declared(request.source)
    parts = (request, run_dir, dict(mounts or {}), folders, context.limits)
    plan_file = await asyncio.to_thread(write_plan, *parts)
    owner = lease.identity or context.kernel_owner
    if owner is not None:
        await asyncio.to_thread(hand_over, run_dir.root, owner)
        lease.keep(run_dir.root)  # the worker removes it: not with what the uid left elsewhere
    reducer = OutputReducer(context.console_cap, console, displays=context.limits.display_caps)
    started = time.monotonic()
    with kernel_failures(request.timeout_seconds):
        result = await lease.execute(
            run_call(plan_file),
            deadline=started + request.timeout_seconds,
            store_history=False,
            on_output=reducer.feed,
            last=True,
        )
    duration_ms = int((time.monotonic() - started) * 1000)
    writable = [spec.name for spec in request.mounts if spec.mode == "rw"]
    owned = run_layout.owned_folders(
        run_dir.root,
        folders,
        run_layout.folders_of(mounts or {}, writable),
        displays=bool(reducer.displays),
    )
    args = (result, reducer, run_dir, context, duration_ms, folders, owned)
    return await asyncio.to_thread(_outcome, *args)


def _outcome(
    result: ExecuteResult,
    reducer: OutputReducer,
    run_dir: RunDir,
    context: ExecutionContext,
    duration_ms: int,
    folders: tuple[str, ...],
    owned: Sequence[run_layout.Folder],
) -> CellOutcome:
    reserved = run_layout.RESERVED_AFTER_FAILURE
    damages = run_layout.check(run_dir.root, owned, reserved)
    mime = mime_files(reducer.displays, run_dir.root, damages)
    report, failure = _report(result, reducer, run_dir)
    lost = run_layout.failure(damages)
    if failure is None and lost is not None:
        failure = (run_layout.FAILURE_TYPE, lost, "")
    listed = output_dirs.listing(run_dir.root, folders, context.limits.output_dir_files)
    notes = run_layout.stderr_lines(damages, in_error=failure is not None) + listed.note
    common: dict[str, Any] = {
        "mime_displays": mime,
        "stdout": reducer.stdout,
        "stderr": reducer.stderr + notes,
        "hardware": context.hardware,
        "duration_ms": duration_ms,
        "output_dirs": listed.files,
        "output_dirs_truncated": listed.marker,
        "mutation_warnings": [],
        "build_env": "",
    }
    if failure is not None:
        ename, evalue, traceback = failure
        return CellOutcome(
            success=False, variables={}, displays=[], error=evalue, error_type=ename,
            traceback=traceback, **common,
        )  # fmt: skip
    return CellOutcome(
        success=True,
        variables=outputs.variables(run_dir.root, report.get("variables") or {}),
        displays=outputs.displays(run_dir.root, report.get("displays")),
        error=None,
        error_type=None,
        traceback=None,
        **common,
    )


def _report(
    result: ExecuteResult, reducer: OutputReducer, run_dir: RunDir
) -> tuple[dict[str, Any], tuple[str, str, str] | None]:
    """The R side's report, or the failure as (type, message, traceback)."""
    if not result.ok:  # the kernel's own error: the R side could not run (or was stopped)
        error = reducer.error
        if error is not None:
            return {}, (error.ename, error.evalue.strip(), error.traceback)
        return {}, ("Error", str(result.reply.get("evalue", "the R kernel stopped the cell")), "")
    try:
        report = outputs.read_report(run_dir.root)
    except (OSError, ValueError) as exc:
        log.error("the R kernel left no readable report: %s", type(exc).__name__)
        return {}, ("Error", "the kernel did not report the cell's outputs", "")
    if not report.get("success"):
        message = str(report.get("error") or "the cell failed")
        return report, ("Error", message, str(report.get("traceback") or message))
    return report, None
