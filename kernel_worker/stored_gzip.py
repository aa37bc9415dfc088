"""Gzip streams for bundles: stored (uncompressed) deflate blocks, or deflated by zlib-ng.

Large bundles are mostly binary (Arrow, pickles, images) that deflate cannot shrink, so they
are sent at gzip level 0. zlib's level 0 still runs its compressor and moves about 550 MB/s
here; framing the data as stored blocks directly costs one copy and a CRC (several GB/s).
The output is plain RFC 1952 gzip (XFL 0) that any gzip reader accepts. The CRC is
zlib-ng's (tens of GB/s; zlib's ran at 2.6 to 4 GB/s, a third of the worker's CPU for a
stored 10 MB bundle).
"""

from __future__ import annotations

import struct
from typing import Protocol

from zlib_ng import zlib_ng

_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # magic, deflate, no flags, mtime 0, OS ?
_BLOCK = 0xFFFF  # the largest stored block
_FULL_BLOCK_HEADER = struct.pack("<BHH", 0, _BLOCK, _BLOCK ^ 0xFFFF)
_LAST_EMPTY_BLOCK = struct.pack("<BHH", 1, 0, 0xFFFF)
GZIP_WBITS = 16 + zlib_ng.MAX_WBITS  # zlib's gzip framing: header (mtime 0), then trailer


def stored_length(size: int) -> int:
    """The exact length of the stream :class:`StoredGzipWriter` makes of ``size`` bytes."""
    full, rest = divmod(size, _BLOCK)
    return (
        len(_HEADER)
        + full * (len(_FULL_BLOCK_HEADER) + _BLOCK)
        + (len(_FULL_BLOCK_HEADER) + rest if rest else 0)
        + len(_LAST_EMPTY_BLOCK)
        + 8  # trailer: CRC32 and size
    )


class _Writable(Protocol):
    def write(self, data: bytes, /) -> int: ...


class StoredGzipWriter:
    """A write-only file object: what is written to it goes out as a stored gzip stream.

    ``close()`` ends the stream (the target is left open). ``tell()`` is the uncompressed
    position, as ``gzip.GzipFile`` reports it.
    """

    def __init__(self, target: _Writable) -> None:
        self._target = target
        self._crc = 0
        self._size = 0
        self._pending = bytearray()
        self._closed = False
        target.write(_HEADER)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Frame ``data``; what completes blocks goes to the target in one write."""
        if self._closed:
            raise ValueError("write to a closed stream")
        view = memoryview(data).cast("B")
        length = len(view)
        self._crc = zlib_ng.crc32(view, self._crc)
        self._size += length
        pending = self._pending
        parts: list[bytes | memoryview] = []
        if pending:
            take = min(length, _BLOCK - len(pending))
            pending += view[:take]
            view = view[take:]
            if len(pending) < _BLOCK:
                return length
            parts += (_FULL_BLOCK_HEADER, bytes(pending))
            pending.clear()
        whole = len(view) - len(view) % _BLOCK
        for start in range(0, whole, _BLOCK):
            parts += (_FULL_BLOCK_HEADER, view[start : start + _BLOCK])
        if parts:
            self._target.write(b"".join(parts))
        pending += view[whole:]
        return length

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        """Nothing to do: data is framed in whole blocks, the rest on close."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        pending = self._pending
        tail = struct.pack("<BHH", 0, len(pending), len(pending) ^ 0xFFFF) + pending
        trailer = struct.pack("<II", self._crc & 0xFFFFFFFF, self._size & 0xFFFFFFFF)
        self._target.write((tail if pending else b"") + _LAST_EMPTY_BLOCK + trailer)
        pending.clear()

    def __enter__(self) -> StoredGzipWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class DeflatingGzipWriter:
    """A write-only file object: what is written to it goes out deflated, as one gzip member.

    zlib-ng's deflate (at level 2: 1.6-2x zlib's level-1 speed, and a smaller result) with
    zlib's own gzip framing (mtime 0). ``close()`` ends the stream (the target is
    left open); ``tell()`` is the uncompressed position.
    """

    def __init__(self, target: _Writable, level: int) -> None:
        self._target = target
        self._deflate = zlib_ng.compressobj(level, zlib_ng.DEFLATED, GZIP_WBITS)
        self._size = 0
        self._closed = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._closed:
            raise ValueError("write to a closed stream")
        out = self._deflate.compress(data)
        if out:
            self._target.write(out)
        length = memoryview(data).nbytes
        self._size += length
        return length

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        """Nothing to do: deflate decides when output is ready, the rest on close."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._target.write(self._deflate.flush())

    def __enter__(self) -> DeflatingGzipWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
