"""A run's Jupyter displays leave the kernel as files, and none passes the display caps.

This module runs inside the Jupyter kernel (shipped as ``strata_kernel_agent.display_files``,
standard library only). IPython sends each display with all of its formats in one IOPub
message, binary ones in base64, and the worker held that message, its text and the decoded
bytes at once: a 200 MiB image cost it about 800 MiB. While a run is on, this module sits in
front of the kernel's display publisher and display hook:

- a format of :data:`SPILL_BYTES` or more is written into the run directory as
  ``display/s<n><ext>`` (the bytes the worker would have written) and the message carries
  ``""`` for it and, in its metadata under :data:`MARKER`, ``{"files": {mime: {"file",
  "bytes"}}}``: the worker never holds the bytes, and copies the file into the bundle;
- a display whose formats add up to more than the cap on one display, or that would take the
  displays the run keeps past the cap on a run's displays, is not written: its message holds
  a ``text/plain`` note instead and ``{"dropped": {"bytes", "cap", "limit"}}`` under
  :data:`MARKER`. A run keeps what a notebook would show, so a display that another
  replaces (``update_display``) or clears (``clear_output``) stops counting, and its files
  are removed.

After the cell, :func:`checked` holds the reference view's displays (``files/__display__<i>``)
to the same caps, and makes a reference display's file and a written display file that hold
the same bytes one file (a hard link): the worker stores that file once in the bundle.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import stat
from collections.abc import Callable, Mapping
from typing import Any

from .archives import size_text
from .plan import DisplayLimits, RunPlan

__all__ = ["MARKER", "SPILL_BYTES", "base64_bytes", "checked", "install", "note", "over", "reason"]

MARKER = "strata_kernel_worker"
"""The metadata key of what this module did to a display (read by the worker)."""
SPILL_BYTES = 4096
"""Formats of at least this many bytes are written as files rather than sent."""
DISPLAY_FLAG = "--max-display-bytes"
RUN_FLAG = "--max-run-display-bytes"
_BINARY = frozenset({"image/png", "image/jpeg", "image/gif", "application/pdf"})
# the file extension of each display format (the worker names its display files by it too)
EXTENSIONS = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/gif": ".gif",
    "image/svg+xml": ".svg",
    "text/html": ".html",
    "text/markdown": ".md",
    "text/latex": ".tex",
    "text/plain": ".txt",
    "application/json": ".json",
    "application/javascript": ".js",
    "application/pdf": ".pdf",
}
_COMPARE_CHUNK = 1024 * 1024
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class _Shown:
    """One display the run keeps: its bytes, its display id, the files written for it."""

    __slots__ = ("display_id", "files", "size")

    def __init__(self, size: int, display_id: object, files: list[str]) -> None:
        self.size = size
        self.display_id = display_id
        self.files = files


class _Run:
    """What one run published: the displays it keeps, in order, and the files written."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.written = 0
        self.shown: list[_Shown] = []
        self.clear_pending = False
        self.files: list[tuple[str, str, int]] = []  # (name, mime, bytes), in order

    def kept_bytes(self) -> int:
        return sum(shown.size for shown in self.shown)

    def forget(self, gone: list[_Shown]) -> None:
        """Stop counting ``gone``; remove its files that no kept display names."""
        self.shown = [shown for shown in self.shown if all(shown is not g for g in gone)]
        named = {name for shown in self.shown for name in shown.files}
        removed = {name for shown in gone for name in shown.files} - named
        for name in removed:
            _unlink(os.path.join(self.folder, name))
        self.files = [entry for entry in self.files if entry[0] not in removed]


_state: dict[str, _Run | None] = {"run": None}


def _run_of(plan: RunPlan) -> _Run | None:
    folder = plan.display_dir
    if not folder:
        return None
    run = _state["run"]
    if run is None or run.folder != folder:  # each run directory is new: a new run
        run = _state["run"] = _Run(folder)
    return run


def install(shell: Any, current_plan: Callable[[], RunPlan | None]) -> None:
    """Put the caps and the files in front of ``shell``'s display publisher and display hook
    (for the run ``current_plan()`` returns; nothing changes outside runs)."""
    publisher = shell.display_pub
    publish, clear = publisher.publish, publisher.clear_output

    def limited_publish(data: Any, metadata: Any = None, **kwargs: Any) -> Any:
        plan = current_plan()
        if plan is not None:
            transient = kwargs.get("transient") or {}
            display_id = transient.get("display_id") if isinstance(transient, dict) else None
            data, metadata = _outgoing(plan, data, metadata, display_id, kwargs.get("update"))
        return publish(data, metadata, **kwargs)

    def limited_clear(wait: bool = False) -> Any:
        plan = current_plan()
        run = _run_of(plan) if plan is not None else None
        if run is not None:
            run.clear_pending = True
            if not wait:
                _apply_clear(run)
        return clear(wait)

    publisher.publish = limited_publish
    publisher.clear_output = limited_clear
    hook = shell.displayhook
    write = getattr(hook, "write_format_data", None)
    if write is None:
        return

    def limited_write(format_dict: Any, md_dict: Any = None) -> Any:
        plan = current_plan()
        if plan is not None:
            format_dict, md_dict = _outgoing(plan, format_dict, md_dict, None, False)
        return write(format_dict, md_dict)

    hook.write_format_data = limited_write


def _apply_clear(run: _Run) -> None:
    if run.clear_pending:
        run.clear_pending = False
        run.forget(list(run.shown))


def _outgoing(
    plan: RunPlan, data: Any, metadata: Any, display_id: object, update: object
) -> tuple[Any, Any]:
    """The display's data and metadata as they are sent: large formats as files, or a note."""
    run = _run_of(plan)
    if run is None or not isinstance(data, dict):
        return data, metadata
    encoded = {mime: _bytes_of(mime, value) for mime, value in data.items()}
    size = sum(len(raw) for raw in encoded.values() if raw is not None)
    replaced = [s for s in run.shown if display_id is not None and s.display_id == display_id]
    if update:
        if not replaced:  # not a display of this run's: nothing it keeps changes
            return data, metadata
    else:
        _apply_clear(run)
        replaced = []
    kept = run.kept_bytes() - sum(s.size for s in replaced)
    dropped = over(plan.limits, size, kept, max(len(replaced), 1))
    if dropped is not None:
        _keep(run, replaced, display_id, 0, [])
        return {"text/plain": note(dropped)}, {MARKER: {"dropped": dropped}}
    files: dict[str, dict[str, object]] = {}
    for mime, raw in encoded.items():
        if raw is not None and len(raw) >= SPILL_BYTES:
            name = _write(run, mime, raw)
            if name is not None:
                files[mime] = {"file": name, "bytes": len(raw)}
    _keep(run, replaced, display_id, size, [str(entry["file"]) for entry in files.values()])
    if not files:
        return data, metadata
    sent = {mime: "" if mime in files else value for mime, value in data.items()}
    described = dict(metadata) if isinstance(metadata, dict) else {}
    described[MARKER] = {"files": files}
    return sent, described


def over(caps: DisplayLimits, size: int, kept: int, copies: int = 1) -> dict[str, object] | None:
    """Why a display of ``size`` bytes, shown ``copies`` times beside ``kept`` bytes the run
    keeps, is dropped under ``caps`` (the plan's limits): ``{"bytes", "cap", "limit"}``;
    None when it fits."""
    one, whole = caps["display_bytes"], caps["run_display_bytes"]
    if size > one:
        return {"bytes": size, "cap": one, "limit": DISPLAY_FLAG}
    if kept + size * copies > whole:
        return {"bytes": size, "cap": whole, "limit": RUN_FLAG}
    return None


def _keep(
    run: _Run, replaced: list[_Shown], display_id: object, size: int, files: list[str]
) -> None:
    if replaced:  # every display of that id now shows this
        run.forget(replaced)
        run.shown.extend(_Shown(size, display_id, files) for _ in replaced)
    else:
        run.shown.append(_Shown(size, display_id, files))


def note(dropped: Mapping[str, object]) -> str:
    """The text a dropped display is replaced by, naming the cap it passed."""
    return f"[display dropped: {reason(dropped)}]"


def reason(dropped: Mapping[str, object]) -> str:
    """Why a display was dropped: ``it holds 200 MiB, over the 64 MiB cap on one display
    (--max-display-bytes)``."""
    size, cap, flag = dropped.get("bytes"), dropped.get("cap"), dropped.get("limit")
    what = "one display" if flag == DISPLAY_FLAG else "the displays of one run"
    if not isinstance(size, int) or not isinstance(cap, int):
        return f"over the cap on {what} ({flag})"
    return f"it holds {size_text(size)}, over the {size_text(cap)} cap on {what} ({flag})"


def _bytes_of(mime: str, value: object) -> bytes | None:
    """The bytes the worker would write for this format (None: left for the kernel to send)."""
    if isinstance(value, bytes | bytearray):
        if mime in _BINARY:
            return bytes(value)
        return base64.b64encode(value)  # how the kernel's JSON sends bytes of a text format
    if mime in _BINARY and isinstance(value, str):
        raw = base64_bytes(value)
        if raw is not None:
            return raw
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        value = "".join(value)
    if isinstance(value, str):
        return value.encode("utf-8", "replace")
    try:
        return json.dumps(value, indent=2, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError):  # the kernel's own JSON cleaning knows more types
        return None


def base64_bytes(text: str) -> bytes | None:
    """The bytes ``text`` holds in base64, or None when it is not base64 (a repr method's
    own text, kept as it came). Line breaks are allowed, as base64 encoders wrap lines;
    anything else outside the alphabet means text: a lenient decode would drop it and turn
    the rest into bytes."""
    try:
        return base64.b64decode(text.replace("\r", "").replace("\n", ""), validate=True)
    except ValueError:  # binascii.Error is one; so is text that is not ASCII
        return None


def _write(run: _Run, mime: str, raw: bytes) -> str | None:
    """``raw`` as a new file in the run's display folder; None when it cannot be written
    there, never through a link (the cell replaced the folder, or took the name: then the
    format is sent as it was)."""
    try:
        if not stat.S_ISDIR(os.lstat(run.folder).st_mode):
            return None
    except OSError:
        return None
    ext = EXTENSIONS.get(mime, ".json" if mime.endswith("json") else ".bin")
    name = f"s{run.written}{ext}"
    run.written += 1
    path = os.path.join(run.folder, name)
    try:
        fd = os.open(path, _CREATE_FLAGS, 0o666)
    except OSError:
        return None
    try:
        with open(fd, "wb") as fh:
            fh.write(raw)
    except OSError:
        _unlink(path)
        return None
    run.files.append((name, mime, len(raw)))
    return name


# -- the reference view, after the cell ------------------------------------------------------------


def checked(displays: list[dict[str, Any]], files_dir: str, plan: RunPlan) -> list[dict[str, Any]]:
    """The reference view's display entries held to the caps (a file over them is removed and
    its entry says why), each sharing its file with a written display file of the same
    bytes."""
    run = _run_of(plan)
    total = 0
    result = []
    for index, entry in enumerate(displays):
        file = entry.get("file") if "error" not in entry else None
        if not isinstance(file, str):
            result.append(entry)
            continue
        path = os.path.join(files_dir, os.path.basename(file))
        size = _regular_size(path)
        if os.path.basename(file).startswith("__display__"):  # not a variable's own file
            dropped = over(plan.limits, size, total)
            if dropped is not None:
                _unlink(path)
                error = f"Display {index} was dropped: {reason(dropped)}"
                result.append({"error": error, "type": "DisplayTooLarge", "dropped": dropped})
                continue
            total += size
        if run is not None:
            _share(run, path, entry.get("content_type"), size)
        result.append(entry)
    return result


def _regular_size(path: str) -> int:
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _share(run: _Run, path: str, mime: object, size: int) -> None:
    """Make the first written display file with ``path``'s bytes a hard link to it."""
    for index, (name, written_mime, written_size) in enumerate(run.files):
        if written_mime != mime or written_size != size or size < SPILL_BYTES:
            continue
        target = os.path.join(run.folder, name)
        if not _same_bytes(path, target):
            continue
        temporary = os.path.join(run.folder, f".{name}.shared-{os.urandom(4).hex()}")
        try:
            os.link(path, temporary, follow_symlinks=False)
            os.replace(temporary, target)
        except OSError:
            _unlink(temporary)
            return
        del run.files[index]  # one reference file per written file
        return


def _same_bytes(first: str, second: str) -> bool:
    """Whether two regular files (reached through no link) hold the same bytes."""
    try:
        with _open_regular(first) as a, _open_regular(second) as b:
            if os.fstat(a.fileno()).st_size != os.fstat(b.fileno()).st_size:
                return False
            while True:
                left, right = a.read(_COMPARE_CHUNK), b.read(_COMPARE_CHUNK)
                if left != right:
                    return False
                if not left:
                    return True
    except OSError:
        return False


def _open_regular(path: str) -> Any:
    fd = os.open(path, _READ_FLAGS)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"not a regular file: {os.path.basename(path)}")
    return open(fd, "rb")
