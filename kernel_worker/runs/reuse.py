"""Large files of finished runs, kept so the next large input or output is written over their
pages.

On a memory filesystem (tmpfs, the default run root) a file's pages are allocated and
zeroed as it is first written, and freed when it is removed: for a 100 MB input that was
~30 ms of the ~50 ms its staging took, plus the removal after the answer. A file written
over in place keeps its pages. So when a run directory is removed, its large regular files
(an input, a kernel's output, a bundle file) are moved into a private folder instead, up to
a byte budget, and a later large input part is staged into one of them: renamed into the
new run directory, written from its start, cut to the length written. A pull run's
download and its stored bundle file are written the same way (``new_file``). Each run's plan
also offers the kept files to its kernel, whose agent takes one the same way for a large
Arrow output once the cell has finished (``offer``; ``forget_taken`` afterwards). The rename
decides who gets a file both reach for: the loser writes a new one.

A file is only kept when nothing else can still read it. Another process with it open or
mapped (an Arrow table or array a cell kept that still points into its input file, a
thread of a cell still reading it) would otherwise see the next request's data. The check
is a write lease (``F_SETLEASE``): Linux grants one only while no other open file refers to
the inode, and an mmap keeps its file open. The file is moved while the lease is held, and
dropped instead if anyone tried to open it meanwhile (the lease was being broken). Files
with more than one link, or owned by another user, are never kept.

Kept files that no request takes within ``idle_seconds`` are removed, so an idle worker
gives the memory back; all of them go when the worker stops. None is kept while the
filesystem has less than twice the budget free.

Only for kernels that run as the worker's own user (they can read any run directory
anyway): with ``--kernel-user`` nothing is kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import stat
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from . import files as run_files

MIN_FILE_BYTES = 1 << 20
"""Smaller files are not worth keeping: their pages cost microseconds."""
OFFERED_FILES = 4
"""How many kept files a run's plan offers its kernel for outputs (the newest)."""

# fcntl names missing from some Python builds (values from <fcntl.h> on Linux)
_F_SETLEASE = getattr(fcntl, "F_SETLEASE", 1024)
_F_GETLEASE = getattr(fcntl, "F_GETLEASE", 1025)
_F_SETSIG = getattr(fcntl, "F_SETSIG", 10)
# a lease break is signalled to its holder: SIGIO by default, which would end the worker;
# SIGURG's default action is to ignore it
_BREAK_SIGNAL = signal.SIGURG


@dataclass(frozen=True, slots=True)
class _Kept:
    path: str
    size: int
    since: float


class ReusableFiles:
    """Kept files in ``folder`` (made on first use), at most ``budget_bytes`` of them.

    Thread-safe: files are kept from cleanup threads and taken on the event loop.
    """

    def __init__(
        self,
        folder: Path,
        budget_bytes: int,
        *,
        idle_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.folder = folder
        self.budget_bytes = budget_bytes
        self.idle_seconds = idle_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: list[_Kept] = []
        self._euid = os.geteuid()

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return self._held()

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._kept)

    def keep(self, path: str) -> bool:
        """Move the file at ``path`` in among the kept ones, if it qualifies (blocking).

        Returns whether it was kept; when not, it is left where it is (the caller removes
        it with its run directory).
        """
        parent, name = os.path.split(path)
        try:
            dir_fd = os.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            return self.keep_at(dir_fd, name)
        finally:
            os.close(dir_fd)

    def keep_at(self, dir_fd: int, name: str) -> bool:
        """:meth:`keep` for the file ``name`` in the directory open as ``dir_fd``.

        Everything goes through ``dir_fd`` and never follows a link, so a directory a cell
        swapped for a link to elsewhere cannot make the worker move a file from there.
        """
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return False
        if not self._qualifies(st) or not self._room_left(dir_fd):
            return False
        with self._lock:
            if self._held() + st.st_size > self.budget_bytes:
                return False
        kept = self._move_if_alone(dir_fd, name, st)
        if kept is None:
            return False
        with self._lock:
            fits = self._held() + st.st_size <= self.budget_bytes
            if fits:
                self._kept.append(_Kept(kept, st.st_size, self._clock()))
        if not fits:  # another thread filled the budget meanwhile
            _unlink(kept)
        return fits

    def take(self, dest: Path, expected_bytes: int) -> bool:
        """Rename the kept file that best fits ``expected_bytes`` to ``dest`` (a new name).

        The caller opens it for writing without truncating it, writes from its start and
        cuts it to the length written. Returns False when none fits (none kept, or each
        more than twice as large: cutting the rest would cost what reuse saves).
        """
        if expected_bytes < MIN_FILE_BYTES:
            return False
        with self._lock:
            fitting = [k for k in self._kept if k.size <= 2 * expected_bytes]
            if not fitting:
                return False
            large_enough = [k for k in fitting if k.size >= expected_bytes]
            chosen = (min(large_enough, key=lambda k: k.size) if large_enough
                      else max(fitting, key=lambda k: k.size))  # fmt: skip
            self._kept.remove(chosen)
        if os.path.lexists(dest):
            _unlink(chosen.path)
            return False
        try:
            os.rename(chosen.path, dest)
        except OSError:
            _unlink(chosen.path)
            return False
        return True

    def offer(self, limit: int = OFFERED_FILES) -> list[tuple[str, int]]:
        """``(path, size)`` of up to ``limit`` kept files, newest first, for a kernel to take
        by renaming (they stay listed here until :meth:`forget_taken`)."""
        with self._lock:
            return [(k.path, k.size) for k in reversed(self._kept[-limit:])]

    def forget_taken(self, offered: list[tuple[str, int]]) -> None:
        """Stop listing the offered files a kernel took (renamed away) during its run."""
        gone = {path for path, _ in offered if not os.path.lexists(path)}
        if gone:
            with self._lock:
                self._kept = [k for k in self._kept if k.path not in gone]

    def release_idle(self) -> int:
        """Remove the files kept for ``idle_seconds`` without a taker (blocking)."""
        cutoff = self._clock() - self.idle_seconds
        with self._lock:
            idle = [k for k in self._kept if k.since <= cutoff]
            self._kept = [k for k in self._kept if k.since > cutoff]
        for kept in idle:
            _unlink(kept.path)
        return len(idle)

    def close(self) -> None:
        """Remove every kept file and the folder (blocking)."""
        with self._lock:
            self._kept.clear()
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- helpers --

    def _held(self) -> int:
        """Bytes kept now (the caller holds the lock)."""
        return sum(k.size for k in self._kept)

    def _qualifies(self, st: os.stat_result) -> bool:
        return (
            stat.S_ISREG(st.st_mode)
            and st.st_size >= MIN_FILE_BYTES
            and st.st_nlink == 1
            and st.st_uid == self._euid
        )

    def _room_left(self, dir_fd: int) -> bool:
        """Whether the filesystem keeps twice the budget free: kept files must not be what
        makes a request's inputs run out of room."""
        try:
            fs = os.fstatvfs(dir_fd)
        except OSError:
            return False
        return fs.f_bavail * fs.f_frsize >= 2 * self.budget_bytes

    def _move_if_alone(self, dir_fd: int, name: str, st: os.stat_result) -> str | None:
        """Under a write lease (nobody else has it open or mapped), move the file here."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_ino != st.st_ino or not _lease(fd):
                return None
            target = str(self.folder / uuid.uuid4().hex)
            try:
                self.folder.mkdir(mode=0o700, exist_ok=True)
                os.rename(name, target, src_dir_fd=dir_fd)
                broken = fcntl.fcntl(fd, _F_GETLEASE) != fcntl.F_WRLCK
            except OSError:
                return None
            finally:
                with contextlib.suppress(OSError):
                    fcntl.fcntl(fd, _F_SETLEASE, fcntl.F_UNLCK)
            if broken:  # someone opened it while it moved: it is not ours alone any more
                _unlink(target)
                return None
            return target
        finally:
            os.close(fd)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _lease(fd: int) -> bool:
    """Take a write lease on ``fd``: granted only if no other open file refers to it."""
    try:
        fcntl.fcntl(fd, _F_SETSIG, _BREAK_SIGNAL)
        fcntl.fcntl(fd, _F_SETLEASE, fcntl.F_WRLCK)
    except OSError:  # EAGAIN: open or mapped elsewhere; EINVAL: no leases on this filesystem
        return False
    return True


def open_reused(files: ReusableFiles, dest: Path, expected_bytes: int) -> int | None:
    """A kept file renamed to ``dest`` and opened for writing over (no truncation), or None.

    Its mode becomes a new file's (``0o666`` less the umask); the caller cuts it to the
    length it wrote (``os.ftruncate``) before closing it.
    """
    if not files.take(dest, expected_bytes):
        return None
    try:
        fd = os.open(dest, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        _unlink(str(dest))
        return None
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
    except OSError:
        os.close(fd)
        _unlink(str(dest))
        return None
    return fd


def new_file(path: Path, files: ReusableFiles | None, expected_bytes: int | None) -> BinaryIO:
    """A new file at ``path`` for writing (blocking): a kept file that fits
    ``expected_bytes`` renamed there when there is one, else a new file, whatever held the
    name removed first (``path`` is in a run directory: see run_files).

    The caller calls ``truncate()`` once it has written everything (a kept file may be
    longer than what was written over it).
    """
    if files is not None and expected_bytes is not None:
        fd = open_reused(files, path, expected_bytes)
        if fd is not None:
            return os.fdopen(fd, "wb")
    return run_files.create(path.parent, [path.name])


def _umask() -> int:
    """The process's umask, read without changing it (Linux); 0o022 when unknown."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"Umask:"):
                return int(line.split()[1], 8)
    return 0o022


_UMASK = _umask()


def keep_and_remove(root: Path, files: ReusableFiles | None) -> None:
    """Remove a run directory, keeping its large files first (blocking).

    The walk holds each directory open and never follows a link (``os.fwalk``).
    """
    if files is not None:
        with contextlib.suppress(OSError):
            for _, _, filenames, dir_fd in os.fwalk(root):
                for name in filenames:
                    files.keep_at(dir_fd, name)
    shutil.rmtree(root, ignore_errors=True)
