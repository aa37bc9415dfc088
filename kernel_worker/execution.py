"""One cell on a leased kernel: plan → one execute_request → outcome.

The run plan travels as data in the request's metadata (the agent's ``pre_run_cell`` hook
binds inputs from it); the agent's ``post_run_cell`` hook serializes the outputs into the run
directory with a JSON report before the kernel replies, so a cell costs one round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kernel_pool import ExecuteResult, ExecutionTimeout, KernelDied, KernelNoReply, Lease

from .agent.plan import KernelLimits, PlannedInput, RunPlan
from .errors import CellTimedOut, KernelCrashed
from .protocol.bundle import CellOutcome
from .protocol.envelopes import CellRequest
from .runs import files as run_files
from .runs import layout as run_layout
from .runs import output_dirs
from .runs.directory import SMALL_IO_BYTES, RunDir, hand_over, offload
from .runs.display_files import mime_files
from .runs.limits import RunLimits
from .runs.messages import ConsoleListener as ConsoleListener  # (service, transfers import it here)
from .runs.messages import OutputReducer
from .runs.reuse import ReusableFiles

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ExecutionContext:
    """What a run needs besides the request: worker-wide facts, computed once."""

    hardware: Mapping[str, object]
    console_cap: int
    kernel_owner: tuple[int, int] | None = None
    """(uid, gid) of the kernels when they run as another user: they get the run dir."""
    inline_io: bool = False
    """Run directories are on a memory filesystem: small file work runs inline (see offload)."""
    reuse: ReusableFiles | None = None
    """Kept files of earlier runs, offered to the kernel for large outputs (see file_reuse)."""
    limits: RunLimits = field(default_factory=RunLimits)
    """The caps on what a run may unpack, display and return (sent to the agent in the plan)."""


def build_plan(
    request: CellRequest,
    run_dir: RunDir,
    env: Mapping[str, str],
    limits: KernelLimits,
    spares: Sequence[tuple[str, int]] = (),
    mounts: Mapping[str, str] | None = None,
    folders: tuple[str, ...] = (),
) -> RunPlan:
    """The data the in-kernel agent needs to bind inputs and collect outputs, complete
    (creating the ``# @output_dir`` folders touches the disk: then use a thread)."""
    inputs = tuple(
        PlannedInput(
            spec.name,
            spec.content_type,
            str(run_dir.inputs / spec.file),
            tuple(
                PlannedInput(sub.name, sub.content_type, str(run_dir.inputs / sub.file))
                for sub in spec.injected
            ),
        )
        for spec in request.inputs
    )
    return RunPlan(
        inputs=inputs,
        paths=MappingProxyType({**(mounts or {}), **output_dirs.prepare(run_dir.dirs, folders)}),
        env=MappingProxyType(dict(env)),
        work_dir=str(run_dir.work),
        files_dir=str(run_dir.files),
        display_dir=str(run_dir.display),
        report_path=str(run_dir.report),
        mutation_defines=tuple(request.mutation_defines),
        tables=request.tables,
        limits=limits,
        spares=tuple(spares),
    )


@contextlib.contextmanager
def kernel_failures(timeout_seconds: float) -> Iterator[None]:
    """Turn a kernel that did not finish a cell (a timeout, death, no reply) into the
    worker's errors; the lease retires the kernel either way."""
    try:
        yield
    except ExecutionTimeout:
        raise CellTimedOut(
            f"Cell execution timed out after {timeout_seconds:g}s. To give it longer, "
            "put a '# @timeout <seconds>' line at the top of the cell, or raise the "
            "notebook's timeout"
        ) from None
    except KernelNoReply:
        raise KernelCrashed(
            "The kernel running the cell stopped answering requests (the cell broke the "
            "kernel's own machinery); it is replaced"
        ) from None
    except KernelDied as exc:
        raise KernelCrashed(
            f"The kernel running the cell died (exit status {exc.exit_code})"
        ) from None


async def run_cell(
    lease: Lease,
    request: CellRequest,
    run_dir: RunDir,
    context: ExecutionContext,
    *,
    console: ConsoleListener | None = None,
    mounts: Mapping[str, str] | None = None,
) -> CellOutcome:
    """Run the cell; raise :class:`CellTimedOut` or :class:`KernelCrashed` when it cannot end.

    ``console`` (optional) sees every stdout/stderr chunk kept, as the kernel produces it;
    ``mounts`` maps mount names to the local folders the cell gets as ``Path`` objects.
    """
    folders = output_dirs.declared(request.source)
    # (a kernel's GPU slot is the pool's: it wins over a caller's CUDA_VISIBLE_DEVICES)
    env = dict(request.env)
    reuse = context.reuse
    offered = reuse.offer() if reuse is not None else []
    parts = (request, run_dir, env, context.limits.for_kernel(), offered, mounts, folders)
    # creating output folders touches the disk: only then is it worth a thread
    plan = await asyncio.to_thread(build_plan, *parts) if folders else build_plan(*parts)
    owner = lease.identity or context.kernel_owner  # the leased kernel's own uid, if any
    if owner is not None:
        await asyncio.to_thread(hand_over, run_dir.root, owner)
        lease.keep(run_dir.root)  # the worker removes it: not with what the uid left elsewhere
    reducer = OutputReducer(context.console_cap, console, displays=context.limits.display_caps)
    started = time.monotonic()
    try:
        with kernel_failures(request.timeout_seconds):
            result = await lease.execute(
                # IPython skips a blank cell entirely (hooks included): run an equivalent no-op
                request.source if request.source.strip() else "pass",
                deadline=started + request.timeout_seconds,
                store_history=False,
                metadata={"strata": plan.to_dict()},
                on_output=reducer.feed,
                last=True,  # one cell per lease: the kernel resets itself right after replying
                stream_cap=context.console_cap,  # the kernel drops (and counts) the rest itself
            )
    finally:
        if reuse is not None and offered:
            reuse.forget_taken(offered)
    duration_ms = int((time.monotonic() - started) * 1000)
    writable = [spec.name for spec in request.mounts if spec.mode == "rw"]
    owned = run_layout.owned_folders(
        run_dir.root,
        folders,
        run_layout.folders_of(mounts or {}, writable),
        displays=bool(reducer.displays),
    )
    small = context.inline_io and not reducer.displays and _size(run_dir.report) <= SMALL_IO_BYTES
    return await offload(
        small, _outcome, result, reducer, run_dir, context, duration_ms, folders, owned
    )


def _size(path: Path) -> int:
    try:
        return os.stat(path, follow_symlinks=False).st_size
    except OSError:
        return 0


def _outcome(
    result: ExecuteResult,
    reducer: OutputReducer,
    run_dir: RunDir,
    context: ExecutionContext,
    duration_ms: int,
    folders: tuple[str, ...],
    owned: Sequence[run_layout.Folder],
) -> CellOutcome:
    # what the cell broke in its run directory is known before anything there is read
    reserved = (run_layout.BUNDLE_FILE,) if result.ok else run_layout.RESERVED_AFTER_FAILURE
    damages = run_layout.check(run_dir.root, owned, reserved)
    mime = mime_files(reducer.displays, run_dir.root, damages)
    lost = run_layout.failure(damages)
    in_error = result.ok and lost is not None
    report, failure = _report(result, reducer, run_dir) if not in_error else ({}, None)
    if failure is None and lost is not None:
        failure = (run_layout.FAILURE_TYPE, lost, "")
    damages.extend(run_layout.set_aside(report.get("displaced")))
    listed = output_dirs.listing(run_dir.root, folders, context.limits.output_dir_files)
    common: dict[str, Any] = {
        "mime_displays": mime,
        "stdout": reducer.stdout,
        "stderr": reducer.stderr + run_layout.stderr_lines(damages, in_error=in_error),
        "hardware": context.hardware,
        "duration_ms": duration_ms,
        "output_dirs": listed.files,
        "output_dirs_truncated": listed.marker,
    }
    common["stderr"] += listed.note  # what the output folders left out, where users look
    if failure is not None:
        ename, evalue, traceback = failure
        return CellOutcome(
            success=False, variables={}, displays=[], error=evalue, error_type=ename,
            traceback=traceback, mutation_warnings=[], build_env="", **common,
        )  # fmt: skip
    return CellOutcome(
        success=True,
        variables=report.get("variables", {}),
        displays=report.get("displays", []),
        error=None,
        error_type=None,
        traceback=None,
        mutation_warnings=report.get("mutation_warnings", []),
        build_env=str(report.get("build_env", "")),
        **common,
    )


def _report(
    result: ExecuteResult, reducer: OutputReducer, run_dir: RunDir
) -> tuple[dict[str, Any], tuple[str, str, str] | None]:
    """The agent's collected outputs, or the cell's failure as (type, message, traceback)."""
    if not result.ok:
        error = reducer.error
        if error is not None:
            return {}, (error.ename, error.evalue, error.traceback)
        reply = result.reply
        return {}, (str(reply.get("ename", "Error")), str(reply.get("evalue", "")), "")
    try:  # the cell could have put a link there: see run_files
        with run_files.open_regular(run_dir.root, [run_dir.report.name]) as fh:
            report = json.load(fh)
    except (OSError, ValueError) as exc:
        log.error("the agent left no readable report: %s", type(exc).__name__)
        report = {"error": "the kernel did not report the cell's outputs"}
    if "error" in report:
        log.error("output collection failed: %s", report["error"])
        message = f"collecting the cell's outputs failed: {report['error']}"
        return report, ("OutputCollectionError", message, "")
    return report, None
