"""Folder inputs (``dir/tar``): unpacked member by member, inside their folder, within caps.

This module runs inside the Jupyter kernel (shipped as ``strata_kernel_agent.archives``,
standard library only). A ``dir/tar`` input may be gzip-, bzip2- or xz-compressed (``tarfile``
detects which), so a small upload can hold far more than it weighs: 1 MB of gzip unpacks to
1 GiB of zeros, 0.6 MB to 100,000 empty files. Each member is checked as the archive is
read, before it is written, the way ``tarfile``'s extraction filters are: it must stay inside
its folder (no ``..``, no link out, no device or FIFO), and it must fit the caps on the bytes
and the entries (files, folders, links) a folder input may unpack to. A member that breaks a
rule stops the unpacking, and what was unpacked so far is removed: nothing past a cap is
ever left on disk. A header that tar keeps in memory (a pax or GNU long-name record) is held
to 1 MiB.

Errors::

    ArchiveError                 (also a ValueError)
    ├── UnsafeArchiveError       a member could land outside its folder
    └── ArchiveTooLargeError     the archive unpacks past a cap
"""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ENTRIES",
    "ArchiveError",
    "ArchiveTooLargeError",
    "UnsafeArchiveError",
    "size_text",
    "unpack",
]

DEFAULT_MAX_BYTES = 2 * 1024**3
"""Bytes a folder input may unpack to, unless the worker says otherwise (its input cap)."""
DEFAULT_MAX_ENTRIES = 50_000
"""Entries (files, folders, links) a folder input may unpack to, unless the worker says."""
MAX_HEADER_BYTES = 1024 * 1024
"""A pax or GNU long-name header is read whole into memory: at most this much of one."""
BYTES_FLAG = "--max-folder-input-bytes"
ENTRIES_FLAG = "--max-folder-input-entries"
_HEADER_TYPES = frozenset(
    {tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE}
    | {tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK}
)


class ArchiveError(ValueError):
    """A ``dir/tar`` input that is not unpacked (nothing of it is left on disk)."""


class UnsafeArchiveError(ArchiveError):
    """A ``dir/tar`` input holds a member that could land outside its folder."""


class ArchiveTooLargeError(ArchiveError):
    """A ``dir/tar`` input unpacks to more bytes or entries than a folder input may."""


def unpack(path: Path, max_bytes: int | None = None, max_entries: int | None = None) -> Path:
    """Unpack ``<stem>.dir.tar`` into the folder ``<stem>.dir`` beside it and return it.

    Raises:
        UnsafeArchiveError: A member would land outside the folder.
        ArchiveTooLargeError: The members would pass ``max_bytes`` or ``max_entries``.
        tarfile.TarError, OSError: The archive cannot be read or the folder written.
    """
    folder = path.with_suffix("")
    rules = _Rules(
        DEFAULT_MAX_BYTES if max_bytes is None else max_bytes,
        DEFAULT_MAX_ENTRIES if max_entries is None else max_entries,
    )
    folder.mkdir(exist_ok=True)
    try:
        with tarfile.open(path, tarinfo=_BoundedHeader) as archive:
            if hasattr(tarfile, "data_filter"):
                archive.extractall(folder, filter=rules.check)
            else:  # pragma: no cover - Pythons before 3.11.4: the rules alone
                for member in archive:
                    archive.extract(rules.check(member, str(folder)), folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


class _Rules:
    """The filter every member passes before it is written: inside the folder, within caps."""

    def __init__(self, max_bytes: int, max_entries: int) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.bytes = 0
        self.entries = 0

    def check(self, member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
        problem = _member_problem(member)
        if problem is not None:
            raise UnsafeArchiveError(f"Refusing to unpack {member.name!r}: {problem}")
        self.entries += 1
        if self.entries > self.max_entries:
            raise ArchiveTooLargeError(
                f"Refusing to unpack the folder: it holds more than {self.max_entries:,} "
                f"entries, the cap on a folder input ({ENTRIES_FLAG})"
            )
        if member.isreg():
            self.bytes += member.size
            if self.bytes > self.max_bytes:
                raise ArchiveTooLargeError(
                    f"Refusing to unpack the folder: it holds more than "
                    f"{size_text(self.max_bytes)}, the cap on a folder input ({BYTES_FLAG}; "
                    f"{member.name.lstrip('/')!r} passes it)"
                )
        data_filter: Any = getattr(tarfile, "data_filter", None)
        if data_filter is not None:
            return data_filter(member, dest)  # type: ignore[no-any-return]
        member.name = member.name.lstrip("/")  # pragma: no cover - as the filter drops it
        return member  # pragma: no cover


def _member_problem(member: tarfile.TarInfo) -> str | None:
    """Why *member* may not be extracted, or None when it stays inside its folder."""
    # a leading "/" is dropped, as tarfile's "data" filter (the reference's) drops it
    name = PurePosixPath(member.name.lstrip("/"))
    if ".." in name.parts:
        return "its path climbs out with '..'"
    if member.isdev():
        return "it is a device or FIFO"
    if member.issym() or member.islnk():
        base = name.parent if member.issym() else PurePosixPath()
        target = PurePosixPath(os.path.normpath(base / member.linkname))
        if PurePosixPath(member.linkname).is_absolute() or target.parts[:1] == ("..",):
            return "it links outside the folder"
    return None


class _BoundedHeader(tarfile.TarInfo):
    """A header whose extended record ``tarfile`` would read whole is refused past 1 MiB."""

    def _proc_member(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _HEADER_TYPES and self.size > MAX_HEADER_BYTES:
            raise ArchiveTooLargeError(
                f"Refusing to unpack the folder: a {size_text(self.size)} extended header "
                f"(over {size_text(MAX_HEADER_BYTES)})"
            )
        checked: tarfile.TarInfo = super()._proc_member(archive)  # type: ignore[misc]
        return checked


def size_text(count: int) -> str:
    """``2 GiB``, ``1.5 MiB``, ``512 bytes``: a size in a message."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if count >= scale:
            return f"{count / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{count} bytes"
