"""One cell on a leased kernel: plan → one execute_request → outcome.

The run plan travels as data in the request's metadata (the agent's ``pre_run_cell`` hook
binds inputs from it); the agent's ``post_run_cell`` hook serializes the outputs into the run
directory with a JSON report before the kernel replies, so a cell costs one round trip.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from kernel_pool import ExecuteResult, ExecutionTimeout, KernelDied, KernelNoReply, Lease

from .agent.display_files import EXTENSIONS
from .errors import CellTimedOut, KernelCrashed, storage_checked
from .protocol.bundle import CellOutcome, MimeDisplay
from .protocol.envelopes import CellRequest
from .runs import displays as display_limits
from .runs import files as run_files
from .runs import layout as run_layout
from .runs import output_dirs
from .runs.displays import JupyterDisplay
from .runs.limits import RunLimits
from .runs.messages import ConsoleListener as ConsoleListener  # (service, transfers import it here)
from .runs.messages import OutputReducer
from .runs.reuse import ReusableFiles

log = logging.getLogger(__name__)
_P = ParamSpec("_P")
_T = TypeVar("_T")

DISPLAY_FOLDER = "display"
"""The run directory's folder of the cell's Jupyter displays, one file per mime type."""
_BINARY_MIME = frozenset({"image/png", "image/jpeg", "image/gif", "application/pdf"})


@dataclass(eq=False, slots=True)
class RunDir:
    """The per-request directory layout (everything the request touches lives here)."""

    root: Path
    received_bytes: int = 0
    """Request bytes staged into it (a hint of how much there is to remove)."""
    waiting_since: float | None = None
    """Event-loop time since which the worker waits for the request body's next bytes;
    None while it is not waiting on the client (staging a chunk, or the body is in)."""
    inputs: Path = field(init=False)
    work: Path = field(init=False)
    files: Path = field(init=False)
    display: Path = field(init=False)
    report: Path = field(init=False)
    """Where the agent writes what it collected (JSON)."""
    dirs: Path = field(init=False)
    bundle_file: Path = field(init=False)
    """Where a bundle written to a file goes."""

    def __post_init__(self) -> None:
        # joined once: the request's path reads them many times
        self.inputs = self.root / "inputs"
        self.work = self.root / "work"
        self.files = self.root / "files"
        self.display = self.root / DISPLAY_FOLDER
        self.report = self.root / run_layout.REPORT_FILE
        self.dirs = self.root / output_dirs.FOLDER
        self.bundle_file = self.root / run_layout.BUNDLE_FILE

    @classmethod
    def make(cls, parent: Path | None) -> RunDir:
        """A new, private run directory under ``parent`` (blocking: use a thread).

        Named like ``mkdtemp`` would (unpredictable, created 0700, never reused), without
        its per-call parameter checks and pure-Python name generator. A parent removed
        since start-up (a temp-dir cleaner) is made again.
        """
        base = os.path.abspath(parent if parent is not None else tempfile.gettempdir())
        prefix = f"{RUN_DIR_PREFIX}{os.getpid()}-"  # the owner's pid: see sweep_stale_run_dirs
        while True:
            root = os.path.join(base, prefix + secrets.token_urlsafe(6))
            try:
                os.mkdir(root, 0o700)
                break
            except FileExistsError:
                continue
            except FileNotFoundError:
                os.makedirs(base, exist_ok=True)
                os.mkdir(root, 0o700)
                break
        try:
            for sub in _RUN_SUBDIRS:
                os.mkdir(os.path.join(root, sub))
        except BaseException:  # (a full filesystem, a path too long): leave nothing behind
            shutil.rmtree(root, ignore_errors=True)
            raise
        return cls(Path(root))


_RUN_SUBDIRS = ("inputs", "work", "files", DISPLAY_FOLDER)


RUN_DIR_PREFIX = "skw-run-"
KEPT_DIR_PREFIX = "skw-kept-"
"""The folder of a worker's kept files (see file_reuse): ``skw-kept-<pid>``."""
_STALE = re.compile(rf"^(?:{RUN_DIR_PREFIX}(\d+)-|{KEPT_DIR_PREFIX}(\d+)$)")


def sweep_stale_run_dirs(parent: Path | None) -> int:
    """Remove run dirs (and kept files) left by workers that died without cleaning up
    (blocking).

    Only directories whose owning process no longer exists are touched, so workers sharing
    a run root leave each other alone. Returns how many were removed.
    """
    root = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    removed = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            match = _STALE.match(entry.name)
            owner = match and int(match[1] or match[2])
            if owner and entry.is_dir(follow_symlinks=False) and not _alive(owner):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


SMALL_IO_BYTES = 256 * 1024
"""File work on at most this many bytes of a memory-backed run dir runs on the event loop."""


async def offload(inline: bool, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Run blocking file work: inline when ``inline`` (a few small files on a memory
    filesystem, where a thread hop costs more than the work itself), else in a thread."""
    if inline:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


def hand_over(root: Path, owner: tuple[int, int]) -> None:
    """Give the kernels' user the run directory (blocking: use a thread).

    Directories and single-link files change owner; hard links (read-only mount views
    sharing the machine's cache blobs) are left alone, since they are readable as they are.
    """
    uid, gid = owner
    os.chown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.lstat(path).st_nlink == 1:
                os.chown(path, uid, gid, follow_symlinks=False)


def build_plan(
    request: CellRequest,
    run_dir: RunDir,
    mounts: Mapping[str, str] | None = None,
    folders: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The data the in-kernel agent needs to bind inputs and collect outputs."""
    inputs = [
        {
            "name": spec.name,
            "content_type": spec.content_type,
            "path": str(run_dir.inputs / spec.file),
            "injected": [
                {
                    "name": sub.name,
                    "content_type": sub.content_type,
                    "path": str(run_dir.inputs / sub.file),
                }
                for sub in spec.injected
            ],
        }
        for spec in request.inputs
    ]
    return {
        "inputs": inputs,
        "paths": {
            **(mounts or {}),
            **output_dirs.prepare(run_dir.dirs, folders),
        },
        "env": dict(request.env),
        "work_dir": str(run_dir.work),
        "files_dir": str(run_dir.files),
        "display_dir": str(run_dir.display),
        "report_path": str(run_dir.report),
        "mutation_defines": list(request.mutation_defines),
        "tables": dict(request.tables),
    }


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
    # creating output folders touches the disk: only then is it worth a thread
    plan = (
        await asyncio.to_thread(build_plan, request, run_dir, mounts, folders)
        if folders
        else build_plan(request, run_dir, mounts)
    )
    if lease.slot is not None:
        # the kernel's GPU wins over a caller's value, for the cell and what it starts
        # (CUDA in the kernel read the slot at start; a child would read this)
        plan["env"]["CUDA_VISIBLE_DEVICES"] = lease.slot
    reuse = context.reuse
    offered = reuse.offer() if reuse is not None else []
    plan["limits"] = context.limits.for_kernel()
    if offered:
        plan["spares"] = offered
    owner = lease.identity or context.kernel_owner  # the leased kernel's own uid, if any
    if owner is not None:
        await asyncio.to_thread(hand_over, run_dir.root, owner)
    reducer = OutputReducer(context.console_cap, console, displays=context.limits.display_caps)
    started = time.monotonic()
    try:
        result = await lease.execute(
            # IPython skips a blank cell entirely (hooks included): run an equivalent no-op
            request.source if request.source.strip() else "pass",
            deadline=started + request.timeout_seconds,
            store_history=False,
            metadata={"strata": plan},
            on_output=reducer.feed,
            last=True,  # one cell per lease: the kernel resets itself right after replying
            stream_cap=context.console_cap,  # the kernel drops (and counts) the rest itself
        )
    except ExecutionTimeout:
        raise CellTimedOut(
            f"Cell execution timed out after {request.timeout_seconds:g}s. To give it longer, "
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
    mime = _mime_files(reducer.displays, run_dir.root, damages)
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


def _mime_files(
    displays: Sequence[JupyterDisplay], run_root: Path, damages: list[run_layout.Damage]
) -> list[MimeDisplay]:
    """The displays' mime files, unless the cell broke their folder (then none; a folder
    broken while they are written, by a process the cell left, is added to ``damages``)."""
    where = f"{DISPLAY_FOLDER}/"
    if not displays or any(damage.where == where for damage in damages):
        return []
    displaced: dict[str, int] = {}
    try:
        with storage_checked("the cell's displays"):
            written = write_jupyter_displays(displays, run_root, displaced)
        damages.extend(run_layout.set_aside(displaced))
        return written
    except OSError:
        lost = run_layout.DISPLAYS_LOST
        damage = run_layout.damage_to(run_root, (DISPLAY_FOLDER,), lost)
        damages.append(damage or run_layout.Damage(where, "something else", lost))
        return []


def write_jupyter_displays(
    displays: Sequence[JupyterDisplay], run_root: Path, displaced: dict[str, int] | None = None
) -> list[MimeDisplay]:
    """Write every mime type of every display as ``display/<index><ext>`` in the run
    directory ``run_root``, each a new file (blocking: use a thread). A format the agent
    wrote as a file itself is that file, if it is as the agent described it (else left out).

    The cell can write in that folder too: whatever it left at a name (a link to a file only
    the worker may write, a FIFO, a folder) is moved aside, never written through (see
    run_files), and told to ``displaced``.
    """
    written: list[MimeDisplay] = []
    for index, display in enumerate(displays):
        files, dropped = display_limits.written_files(display), display_limits.dropped(display)
        for mime, value in display.data.items():
            if mime in files:  # the agent wrote it (see display_limits)
                name, size = files[mime]
                if display_limits.verified_file(run_root, name, size):
                    written.append(MimeDisplay(name, mime, index, display.output_type))
                continue
            ext = EXTENSIONS.get(mime, ".json" if mime.endswith("json") else ".bin")
            name = f"{index}{ext}" if ext != ".bin" else f"{index}-{len(written)}.bin"
            with run_files.create(run_root, [DISPLAY_FOLDER, name], displaced) as fh:
                fh.write(_mime_bytes(mime, value))
            written.append(MimeDisplay(name, mime, index, display.output_type, dropped))
    return written


def _mime_bytes(mime: str, value: Any) -> bytes:
    """A display's value as its file's bytes. Text is UTF-8 (a lone surrogate becomes U+FFFD);
    a binary type's base64 is decoded, and one that is not base64 (a repr method's own
    text) is kept as the text it came as."""
    if mime in _BINARY_MIME and isinstance(value, str):
        try:
            return base64.b64decode(value)
        except binascii.Error:
            pass
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = "".join(value)
    if isinstance(value, str):
        return value.encode("utf-8", "replace")
    return json.dumps(value, indent=2).encode("utf-8")
