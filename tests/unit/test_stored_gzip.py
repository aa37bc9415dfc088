"""The gzip streams bundles are written with, stored or deflated: any gzip reader gets the
data back."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_worker.protocol.stored_gzip import DeflatingGzipWriter, StoredGzipWriter, stored_length


def written(chunks: list[bytes]) -> bytes:
    out = io.BytesIO()
    with StoredGzipWriter(out) as gz:
        for chunk in chunks:
            assert gz.write(chunk) == len(chunk)
        assert gz.tell() == sum(map(len, chunks))
    return out.getvalue()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=3000) | st.integers(0, 200_000).map(os.urandom), max_size=8))
def test_any_sequence_of_writes_round_trips(chunks: list[bytes]) -> None:
    data = written(chunks)
    assert len(data) == stored_length(sum(map(len, chunks)))  # however the writes fell
    assert gzip.decompress(data) == b"".join(chunks)
    # zlib's own gzip decoder, strict about the trailer too
    assert zlib.decompress(data, 16 + zlib.MAX_WBITS) == b"".join(chunks)


def test_block_boundaries_and_header() -> None:
    for size in (0, 1, 0xFFFE, 0xFFFF, 0x10000, 3 * 0xFFFF, 3 * 0xFFFF + 7):
        payload = os.urandom(size)
        data = written([payload])
        assert gzip.decompress(data) == payload
        assert data[8] == 0  # XFL: stored
        # stored: the stream is the data plus 5 bytes a block and 18 of header and trailer
        assert len(data) <= size + 5 * (size // 0xFFFF + 2) + 18
        assert len(data) == stored_length(size)


def test_a_tar_written_through_it_reads_back() -> None:
    out = io.BytesIO()
    big = os.urandom(300_000)
    with StoredGzipWriter(out) as gz, tarfile.TarFile(fileobj=gz, mode="w") as tar:  # type: ignore[arg-type]
        for name, data in (("a.bin", big), ("b.txt", b"hello")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with tarfile.open(fileobj=io.BytesIO(out.getvalue()), mode="r:gz") as tar:
        assert tar.extractfile("a.bin").read() == big  # type: ignore[union-attr]
        assert tar.extractfile("b.txt").read() == b"hello"  # type: ignore[union-attr]


def test_writing_after_close_is_refused() -> None:
    gz = StoredGzipWriter(io.BytesIO())
    gz.close()
    gz.close()  # idempotent
    with pytest.raises(ValueError):
        gz.write(b"x")


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.binary(max_size=3000) | st.integers(0, 200_000).map(os.urandom), max_size=8),
    st.sampled_from([1, 2, 6, 9]),
)
def test_deflated_writes_round_trip(chunks: list[bytes], level: int) -> None:
    out = io.BytesIO()
    with DeflatingGzipWriter(out, level) as gz:
        for chunk in chunks:
            assert gz.write(memoryview(chunk)) == len(chunk)
        assert gz.tell() == sum(map(len, chunks))
    data = out.getvalue()
    assert gzip.decompress(data) == b"".join(chunks)
    assert zlib.decompress(data, 16 + zlib.MAX_WBITS) == b"".join(chunks)


def test_deflated_text_shrinks_and_the_header_names_the_level() -> None:
    text = b"a,b,c\n1,2,3\n" * 100_000
    sizes = {}
    for level in (2, 9):
        out = io.BytesIO()
        with DeflatingGzipWriter(out, level) as gz:
            gz.write(text)
        data = out.getvalue()
        assert data[:4] == b"\x1f\x8b\x08\x00" and data[4:8] == bytes(4)  # no name, mtime 0
        assert data[8] == (2 if level == 9 else 0)  # XFL, as zlib writes it
        sizes[level] = len(data)
        assert gzip.decompress(data) == text
    assert sizes[9] <= sizes[2] < len(text) // 50
    gz = DeflatingGzipWriter(io.BytesIO(), 2)
    gz.close()
    gz.close()  # idempotent
    with pytest.raises(ValueError):
        gz.write(b"x")
