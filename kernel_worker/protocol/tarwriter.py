"""A write-only tar stream for bundles: the bytes ``tarfile`` writes, a header at a time.

Every bundle member is a regular file with the same metadata (mode 0644, uid/gid 0, no
owner names, mtime 0), so only the name and size vary. There are no links: a reader taking
the archive as a stream cannot resolve one. For the common member (an ASCII name of at
most 100 characters, under 8 GiB) the POSIX header is assembled here directly; ``tarfile``
spent more time building a small bundle's headers (``TarInfo``, its PAX checks, field
encoding) than deflating the whole bundle. Any other member gets
``tarfile``'s own PAX header. The archive is byte for byte what
``tarfile.TarFile(format=PAX_FORMAT)`` writes for the same members.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterable
from typing import BinaryIO

__all__ = ["TarWriter"]

BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE
_NUL_BLOCK = bytes(BLOCK)
_MAX_PLAIN_SIZE = 8**11 - 1  # the largest size the 12-byte octal field holds
_MAX_NAME = 100  # the name field
_MODE = 0o644
# name(100) | mode uid gid (8 each) | size(12) | mtime(12) | chksum(8) | type(1)
# | linkname(100) | magic+version(8) | uname gname (32 each) | devmajor devminor (8 each)
# | prefix(155) | pad(12)
_MODE_UID_GID = b"%07o\0" % _MODE + b"%07o\0" % 0 + b"%07o\0" % 0
_MTIME = b"%011o\0" % 0
# what follows the checksum: the type (a regular file), an empty linkname, magic, zeros
_AFTER_CHECKSUM = (
    tarfile.REGTYPE + bytes(_MAX_NAME) + tarfile.POSIX_MAGIC + bytes(32 + 32 + 8 + 8 + 155 + 12)
)
_CHECKSUM_AFTER = sum(_AFTER_CHECKSUM)


def _plain(text: str) -> bytes | None:
    """``text`` as a header field needs no PAX record: ASCII, at most 100 characters."""
    if len(text) > _MAX_NAME or not text.isascii():
        return None
    return text.encode("ascii")


def _header(name: str, size: int) -> bytes:
    """The header of a regular file member."""
    plain_name = _plain(name)
    if plain_name is None or size > _MAX_PLAIN_SIZE:
        info = tarfile.TarInfo(name)
        info.size = size
        info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = _MODE, 0, 0, 0, "", ""
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    head = plain_name.ljust(_MAX_NAME, b"\0") + _MODE_UID_GID + b"%011o\0" % size + _MTIME
    checksum = sum(head) + _CHECKSUM_AFTER + 8 * 0x20  # the checksum field counts as spaces
    return head + b"%06o\0 " % checksum + _AFTER_CHECKSUM


class TarWriter:
    """Members written to ``fileobj`` (which only needs ``write``); :meth:`close` ends the
    archive (it does not close ``fileobj``).

    With ``fileobj=None`` nothing is written or read: :attr:`size` is then the length the
    same calls would write (files count as their given size).
    """

    def __init__(self, fileobj: BinaryIO | None, *, copy_bytes: int = 1 << 20) -> None:
        self._out = fileobj
        self._copy_bytes = copy_bytes
        self._offset = 0

    @property
    def measuring(self) -> bool:
        """Whether nothing is written (``fileobj=None``): the calls only add up :attr:`size`."""
        return self._out is None

    @property
    def size(self) -> int:
        """The bytes written (or, measuring, that would have been) so far."""
        return self._offset

    def _write(self, data: bytes | memoryview) -> None:
        if self._out is not None:
            self._out.write(data)
        self._offset += len(data)

    def _pad(self, size: int) -> None:
        if size % BLOCK:
            self._write(_NUL_BLOCK[: BLOCK - size % BLOCK])

    def add_bytes(self, name: str, data: bytes) -> None:
        self._write(_header(name, len(data)))
        self._write(data)
        self._pad(len(data))

    def add_chunks(self, name: str, size: int, chunks: Iterable[bytes | memoryview]) -> None:
        """A member of ``size`` bytes: ``chunks``, which must add up to exactly that (they
        are not read when measuring)."""
        self._write(_header(name, size))
        if self._out is None:  # measuring
            self._offset += size
            self._pad(size)
            return
        written = 0
        for chunk in chunks:
            self._write(chunk)
            written += len(chunk)
        if written != size:
            raise ValueError(f"{name}: {written} bytes where {size} were announced")
        self._pad(size)

    def add_file(self, name: str, source: BinaryIO, size: int) -> None:
        """``size`` bytes read from ``source``; fewer is an ``OSError`` (as in tarfile)."""
        self._write(_header(name, size))
        if self._out is None:  # measuring
            self._offset += size
            self._pad(size)
            return
        left = size
        while left:
            chunk = source.read(min(left, self._copy_bytes))
            if not chunk:
                raise OSError(f"{name}: unexpected end of data")
            self._write(chunk)
            left -= len(chunk)
        self._pad(size)

    def close(self) -> None:
        """Two zero blocks, then zeros up to a whole record (20 blocks), as tarfile ends."""
        self._write(_NUL_BLOCK * 2)
        if self._offset % _RECORD:
            self._write(bytes(_RECORD - self._offset % _RECORD))
