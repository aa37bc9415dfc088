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
from typing import Protocol, Self

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


class _GzipWriter:
    """A write-only file object that ends its gzip stream on ``close()`` (the target is left
    open); ``tell()`` is the uncompressed position, as ``gzip.GzipFile`` reports it."""

    def __init__(self, target: _Writable) -> None:
        self._target = target
        self._size = 0
        self._closed = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._closed:
            raise ValueError("write to a closed stream")
        length = memoryview(data).nbytes
        self._write(data)
        self._size += length
        return length

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        """Nothing to do: output goes out as it is ready, the rest on close."""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._target.write(self._end())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        raise NotImplementedError

    def _end(self) -> bytes:
        """What ends the stream."""
        raise NotImplementedError


class StoredGzipWriter(_GzipWriter):
    """What is written to it goes out as a stored gzip stream (see :class:`_GzipWriter`)."""

    def __init__(self, target: _Writable) -> None:
        super().__init__(target)
        self._crc = 0
        self._pending = bytearray()
        target.write(_HEADER)

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        """Frame ``data``; what completes blocks goes to the target in one write."""
        view = memoryview(data).cast("B")
        self._crc = zlib_ng.crc32(view, self._crc)
        pending = self._pending
        parts: list[bytes | memoryview] = []
        if pending:
            take = min(len(view), _BLOCK - len(pending))
            pending += view[:take]
            view = view[take:]
            if len(pending) < _BLOCK:
                return
            parts += (_FULL_BLOCK_HEADER, bytes(pending))
            pending.clear()
        whole = len(view) - len(view) % _BLOCK
        for start in range(0, whole, _BLOCK):
            parts += (_FULL_BLOCK_HEADER, view[start : start + _BLOCK])
        if parts:
            self._target.write(b"".join(parts))
        pending += view[whole:]

    def _end(self) -> bytes:
        pending = self._pending
        tail = struct.pack("<BHH", 0, len(pending), len(pending) ^ 0xFFFF) + pending
        trailer = struct.pack("<II", self._crc & 0xFFFFFFFF, self._size & 0xFFFFFFFF)
        ending = (tail if pending else b"") + _LAST_EMPTY_BLOCK + trailer
        pending.clear()
        return ending


class DeflatingGzipWriter(_GzipWriter):
    """What is written to it goes out deflated, as one gzip member (see :class:`_GzipWriter`).

    zlib-ng's deflate (at level 2: 1.6-2x zlib's level-1 speed, and a smaller result) with
    zlib's own gzip framing (mtime 0).
    """

    def __init__(self, target: _Writable, level: int) -> None:
        super().__init__(target)
        self._deflate = zlib_ng.compressobj(level, zlib_ng.DEFLATED, GZIP_WBITS)

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        out = self._deflate.compress(data)
        if out:
            self._target.write(out)

    def _end(self) -> bytes:
        return self._deflate.flush()
