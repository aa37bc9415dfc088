"""Folder inputs (``dir/tar``) unpack within their caps, checked before each member is written."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from kernel_worker.agent import archives, codecs

MIB = 1024 * 1024


def _archive(path: Path, members: list[tuple[str, bytes]], mode: str = "w") -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _declared_only(path: Path, name: str, size: int) -> Path:
    """A tar whose one member's header says ``size`` bytes and no data follows: reading the
    member (to write it) fails with tarfile's "unexpected end of data"."""
    info = tarfile.TarInfo(name)
    info.size = size
    path.write_bytes(info.tobuf(tarfile.PAX_FORMAT) + b"\0" * 1024)
    return path


@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
def test_bytes_past_the_cap_stop_the_unpacking_and_nothing_is_left(
    tmp_path: Path, mode: str
) -> None:
    archive = _archive(
        tmp_path / "x.dir.tar", [("a.bin", b"a" * 600), ("sub/b.bin", b"b" * 600)], mode
    )
    with pytest.raises(archives.ArchiveTooLargeError) as caught:
        archives.unpack(archive, max_bytes=1000)
    message = str(caught.value)
    assert "1000 bytes" in message and "--max-folder-input-bytes" in message
    assert "sub/b.bin" in message
    assert not (tmp_path / "x.dir").exists()  # what was unpacked before it is removed too


def test_a_member_past_the_cap_is_refused_before_any_of_it_is_read(tmp_path: Path) -> None:
    # had the member been written, its missing data would be tarfile's ReadError instead
    archive = _declared_only(tmp_path / "x.dir.tar", "zeros.bin", 1024**3)
    with pytest.raises(archives.ArchiveTooLargeError, match="--max-folder-input-bytes"):
        archives.unpack(archive, max_bytes=64 * MIB)
    assert not (tmp_path / "x.dir").exists()
    with pytest.raises(tarfile.ReadError):  # the same archive, within the cap: it is read
        archives.unpack(archive, max_bytes=2 * 1024**3)


def test_entries_past_the_cap_stop_the_unpacking(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "x.dir.tar", [(f"f{i}", b"") for i in range(11)], "w:gz")
    with pytest.raises(archives.ArchiveTooLargeError) as caught:
        archives.unpack(archive, max_entries=10)
    assert "more than 10 entries" in str(caught.value)
    assert "--max-folder-input-entries" in str(caught.value)
    assert not (tmp_path / "x.dir").exists()


def test_an_archive_exactly_at_both_caps_unpacks(tmp_path: Path) -> None:
    members = [("a.bin", b"a" * 600), ("sub/b.bin", b"b" * 400)]
    folder = archives.unpack(_archive(tmp_path / "x.dir.tar", members), 1000, 2)
    assert (folder / "a.bin").read_bytes() == b"a" * 600
    assert (folder / "sub" / "b.bin").read_bytes() == b"b" * 400


def test_a_huge_extended_header_is_refused_unread(tmp_path: Path) -> None:
    info = tarfile.TarInfo("x")
    info.pax_headers = {"comment": "z" * (2 * MIB)}
    path = tmp_path / "x.dir.tar"
    path.write_bytes(info.tobuf(tarfile.PAX_FORMAT) + b"\0" * 1024)
    with pytest.raises(archives.ArchiveTooLargeError, match="extended header"):
        archives.unpack(path)


def test_load_input_applies_the_workers_caps(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "x.dir.tar", [("a.bin", b"a" * 2000)])
    with pytest.raises(codecs.ArchiveTooLargeError, match="1000 bytes"):
        codecs.load_input(str(archive), "dir/tar", limits={"folder_input_bytes": 1000})
    folder = codecs.load_input(str(archive), "dir/tar", limits={"folder_input_bytes": 2000})
    assert isinstance(folder, Path) and (folder / "a.bin").stat().st_size == 2000
    assert issubclass(codecs.UnsafeArchiveError, ValueError)


def test_an_unsafe_member_after_safe_ones_leaves_nothing(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "x.dir.tar", [("ok.txt", b"ok"), ("../escape.txt", b"x")])
    with pytest.raises(archives.UnsafeArchiveError, match="Refusing to unpack"):
        archives.unpack(archive)
    assert not (tmp_path / "x.dir").exists() and not (tmp_path / "escape.txt").exists()
