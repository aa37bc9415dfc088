"""One run directory: its layout, making it, handing it to the kernels' user, and sweeping
the ones a dead worker left.

Everything a request touches lives in its run directory: the staged inputs, the cell's
working folder, the outputs the agent writes, the displays' files, the report and (for pull
runs) the bundle file. :class:`RunDir` names those places once; :func:`offload` runs the
blocking file work on them where it costs least.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ParamSpec, TypeVar

from . import layout, output_dirs

__all__ = [
    "DISPLAY_FOLDER",
    "KEPT_DIR_PREFIX",
    "RUN_DIR_PREFIX",
    "SMALL_IO_BYTES",
    "RunDir",
    "hand_over",
    "offload",
    "sweep_stale_run_dirs",
]

_P = ParamSpec("_P")
_T = TypeVar("_T")

DISPLAY_FOLDER = "display"
"""The run directory's folder of the cell's Jupyter displays, one file per mime type."""
RUN_DIR_PREFIX = "skw-run-"
KEPT_DIR_PREFIX = "skw-kept-"
"""The folder of a worker's kept files (see file_reuse): ``skw-kept-<pid>``."""
_RUN_SUBDIRS = ("inputs", "work", "files", DISPLAY_FOLDER)
_STALE = re.compile(rf"^(?:{RUN_DIR_PREFIX}(\d+)-|{KEPT_DIR_PREFIX}(\d+)$)")

SMALL_IO_BYTES = 256 * 1024
"""File work on at most this many bytes of a memory-backed run dir runs on the event loop."""


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
        self.report = self.root / layout.REPORT_FILE
        self.dirs = self.root / output_dirs.FOLDER
        self.bundle_file = self.root / layout.BUNDLE_FILE

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


async def offload(inline: bool, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Run blocking file work: inline when ``inline`` (a few small files on a memory
    filesystem, where a thread hop costs more than the work itself), else in a thread."""
    if inline:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)
