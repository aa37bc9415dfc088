"""The bundles' tar writer: the same bytes as tarfile's PAX writer, member for member."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_worker.protocol.tarwriter import TarWriter

# (kind, name, payload): kind "bytes" (add_bytes) or "file" (add_file)
Member = tuple[str, str, bytes]

MEMBERS: list[Member] = [
    ("bytes", "stdout.txt", b"hello\n"),
    ("bytes", "stderr.txt", b""),
    ("bytes", "block.bin", b"x" * 512),  # exactly one block: no padding
    ("file", "files/result.arrow", b"\x00\xff" * 3000),
    ("bytes", "files/" + "n" * 94, b"a name of exactly 100 characters"),
    ("bytes", "dirs/out/" + "long" * 30 + ".csv", b"a,b\n"),  # over 100: PAX path record
    ("bytes", "dirs/out/données.csv", b"non-ASCII name: PAX path record"),
    ("file", "dirs/out/" + "y" * 120, b"a long name from a file"),
    ("bytes", "manifest.json", b'{"success": true}'),
]


def reference(members: list[Member]) -> bytes:
    out = io.BytesIO()
    with tarfile.TarFile(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for _, name, payload in members:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = (
                0o644, 0, 0, 0, "", ""
            )  # fmt: skip
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return out.getvalue()


def ours(members: list[Member]) -> bytes:
    out = io.BytesIO()
    tar = TarWriter(out, copy_bytes=1000)  # several reads per file
    for kind, name, payload in members:
        if kind == "file":
            tar.add_file(name, io.BytesIO(payload), len(payload))
        else:
            tar.add_bytes(name, payload)
    tar.close()
    return out.getvalue()


def test_the_bytes_are_tarfiles() -> None:
    assert ours(MEMBERS) == reference(MEMBERS)


def test_an_empty_archive_is_tarfiles() -> None:
    assert ours([]) == reference([])


# Member names are identifiers and paths read from disk: any character but NUL and "/",
# where a surrogate can only be an undecodable byte of a file name (U+DC80..U+DCFF, as
# os.listdir decodes it). Other lone surrogates have no bytes for a tar header at all.
_NAME_CHARACTERS = st.one_of(
    st.characters(exclude_characters="\0/", exclude_categories=("Cs",)),
    st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF),
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["bytes", "file"]),
            st.text(_NAME_CHARACTERS, min_size=1, max_size=130),
            st.binary(max_size=1500),
        ),
        max_size=6,
    )
)
def test_any_member_names_give_tarfiles_bytes(members: list[Member]) -> None:
    assert ours(members) == reference(members)


def test_a_short_file_is_an_error() -> None:
    tar = TarWriter(io.BytesIO())
    with pytest.raises(OSError, match="unexpected end of data"):
        tar.add_file("files/x", io.BytesIO(b"12"), 3)


@pytest.mark.skipif(shutil.which("tar") is None, reason="no tar on this machine")
def test_gnu_tar_reads_it(tmp_path: Path) -> None:
    archive = tmp_path / "bundle.tar"
    archive.write_bytes(ours(MEMBERS))
    listing = subprocess.run(
        ["tar", "-tvf", str(archive)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert len(listing) == len(MEMBERS)
    assert all(line.startswith("-rw-r--r--") for line in listing)  # regular files, 0644
    assert "dirs/out/données.csv" in listing[6]
    wanted = ["files/result.arrow", "dirs/out/" + "y" * 120]
    subprocess.run(["tar", "-xf", str(archive), "-C", str(tmp_path), *wanted], check=True)
    assert (tmp_path / "files" / "result.arrow").read_bytes() == b"\x00\xff" * 3000
    assert (tmp_path / "dirs" / "out" / ("y" * 120)).read_bytes() == b"a long name from a file"
