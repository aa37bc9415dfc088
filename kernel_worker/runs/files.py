"""Files below a run directory, reached without following links.

With ``--kernel-user`` the kernels' user owns everything below a run directory's root (the
root's own name, in the worker's private run root, it cannot change). While any process of
its own runs, it may replace a file or folder there with a link to something only the worker
may read or write, or with a FIFO. So the worker never resolves such a path by name: each
step below the root is opened with ``O_NOFOLLOW`` relative to the one before; a file is read
only when it is regular (opened ``O_NONBLOCK``, so a FIFO cannot hang a thread); and a file is
written only as a new one (``O_EXCL``), after whatever held its name was moved aside (it goes
with the run directory).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_ATTEMPTS = 3


def open_dir(root: Path, parts: Sequence[str]) -> int:
    """A descriptor for the folder ``root/<parts…>``; no step below ``root`` may be a link.

    Raises:
        OSError: A step is missing, not a folder, or a link (``ELOOP``/``ENOTDIR``).
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            _check_name(part)
            inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(root: Path, parts: Sequence[str]) -> BinaryIO:
    """``root/<parts…>`` opened for reading, if it is a regular file reached through no link.

    Raises:
        OSError: It is missing, not a regular file, or a step to it is a link.
    """
    *folders, leaf = parts
    _check_name(leaf)
    dir_fd = open_dir(root, folders)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(leaf, flags, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"not a regular file: {'/'.join(parts)}")
    return os.fdopen(fd, "rb")


def create(root: Path, parts: Sequence[str], displaced: dict[str, int] | None = None) -> BinaryIO:
    """A new file at ``root/<parts…>`` for writing (mode ``0o666`` less the umask).

    Whatever held the name (a link, a FIFO, a file, a folder) is moved aside to a hidden
    name in the same folder first, never written through; ``displaced`` (when given) is told
    its ``st_mode`` under the path's ``/``-joined name.

    Raises:
        OSError: The folder cannot be reached through no link, or the name keeps being taken.
    """
    *folders, leaf = parts
    _check_name(leaf)
    dir_fd = open_dir(root, folders)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        for _ in range(_CREATE_ATTEMPTS):
            try:
                return os.fdopen(os.open(leaf, flags, 0o666, dir_fd=dir_fd), "wb")
            except FileExistsError:
                aside = f".{leaf}.displaced-{secrets.token_hex(4)}"
                with contextlib.suppress(FileNotFoundError):
                    mode = os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False).st_mode
                    os.rename(leaf, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                    if displaced is not None:
                        displaced.setdefault("/".join(parts), mode)
        raise FileExistsError(f"{'/'.join(parts)} kept being created by someone else")
    finally:
        os.close(dir_fd)


def regular_files(root: Path, parts: Sequence[str]) -> dict[str, tuple[int, int]]:
    """``{posix relative path: (size, mtime_ns)}`` of the regular files below
    ``root/<parts…>``; links are neither listed nor followed.

    Raises:
        OSError: The folder cannot be reached through no link.
    """
    found: dict[str, tuple[int, int]] = {}
    top = open_dir(root, parts)
    try:
        for dirpath, _dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=top):
            for name in filenames:
                with contextlib.suppress(OSError):  # gone since the folder was listed
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        rel = os.path.normpath(os.path.join(dirpath, name))
                        found[Path(rel).as_posix()] = (st.st_size, st.st_mtime_ns)
    finally:
        os.close(top)
    return found


def first_regular_files(
    root: Path, parts: Sequence[str], room: int | None
) -> tuple[dict[str, tuple[int, int]], bool]:
    """As :func:`regular_files`, but at most ``room`` of them (None: all), and whether there
    are more. The walk stops at the first file past ``room``, so a folder of a million files
    is never listed whole; which files come first is the folders' own order. One descriptor
    is held per level.

    Raises:
        OSError: The folder cannot be reached through no link.
    """
    found: dict[str, tuple[int, int]] = {}
    stack: list[tuple[int, str, list[str]]] = []
    try:
        stack.append(_read_folder(open_dir(root, parts), "", found, room))
        while stack:
            fd, prefix, folders = stack[-1]
            if room is not None and len(found) > room:
                for path in list(found)[room:]:
                    del found[path]
                return found, True
            if not folders:
                os.close(stack.pop()[0])
                continue
            name = folders.pop()
            try:  # gone, or replaced by a link, since it was listed: skipped
                inner = os.open(name, _DIR_FLAGS, dir_fd=fd)
                stack.append(_read_folder(inner, f"{prefix}{name}/", found, room))
            except OSError:
                continue
    finally:
        for fd, _prefix, _folders in stack:
            os.close(fd)
    return found, False


def _read_folder(
    fd: int, prefix: str, found: dict[str, tuple[int, int]], room: int | None
) -> tuple[int, str, list[str]]:
    """Add the folder ``fd``'s regular files to ``found`` (stopping one past ``room``);
    return the frame that walks its sub-folders next (``fd`` is closed if it fails)."""
    folders: list[str] = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:  # gone since the folder was listed
                    continue
                if stat.S_ISREG(st.st_mode):
                    found[f"{prefix}{entry.name}"] = (st.st_size, st.st_mtime_ns)
                    if room is not None and len(found) > room:
                        break
                elif stat.S_ISDIR(st.st_mode):
                    folders.append(entry.name)
    except OSError:
        os.close(fd)
        raise
    return fd, prefix, folders


def _check_name(part: str) -> None:
    """One plain step: not empty, not ``.``/``..``, no separator."""
    if part in ("", ".", "..") or "/" in part or "\0" in part:
        raise OSError(f"not a plain name: {part!r}")
