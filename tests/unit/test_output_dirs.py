"""Output folders: listed through no link, at most ``--max-output-dir-files`` files in all."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from kernel_worker.pull.output_stream import OutputDirStreamer
from kernel_worker.runs import files as run_files
from kernel_worker.runs import output_dirs
from tests.fake_store import FakeStore


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run directory whose output folders ``a`` and ``b`` hold 7 files each (2 nested), and
    a link and a FIFO the listing must skip."""
    root = tmp_path / "run"
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("not the cell's")
    for name in ("a", "b"):
        folder = root / "dirs" / name
        (folder / "sub" / "deep").mkdir(parents=True)
        for i in range(5):
            (folder / f"f{i}").write_text("x" * i)
        (folder / "sub" / "s.txt").write_text("s")
        (folder / "sub" / "deep" / "d.txt").write_text("dd")
        (folder / "link").symlink_to(tmp_path / "outside" / "secret")
        (folder / "to-outside").symlink_to(tmp_path / "outside")
        os.mkfifo(folder / "pipe")
    return root


def test_every_regular_file_is_listed_and_no_link_followed(run: Path) -> None:
    listed = output_dirs.listing(run, ("a", "b"))
    expected = {"f0": 0, "f1": 1, "f2": 2, "f3": 3, "f4": 4, "sub/s.txt": 1, "sub/deep/d.txt": 2}
    assert listed.files == {"a": expected, "b": expected}
    assert listed.truncated == () and listed.marker is None and listed.note == ""
    assert run_files.first_regular_files(run, ["dirs", "a"], None) == (
        run_files.regular_files(run, ["dirs", "a"]),
        False,
    )


def test_the_cap_counts_every_folder_together(run: Path) -> None:
    listed = output_dirs.listing(run, ("a", "b"), 9)
    assert len(listed.files["a"]) == 7 and len(listed.files["b"]) == 2
    assert listed.marker == {"folders": ["b"], "max_files": 9, "limit": "--max-output-dir-files"}
    assert "more than 9 files in all" in listed.note and "(in b)" in listed.note
    full = output_dirs.listing(run, ("a", "b"), 7)
    assert full.files["b"] == {} and full.truncated == ("b",)
    exact = output_dirs.listing(run, ("a", "b", "missing"), 14)
    assert exact.truncated == () and exact.files["missing"] == {}


def test_a_folder_replaced_by_a_link_holds_nothing(run: Path) -> None:
    (run / "dirs" / "a").rename(run / "moved")
    (run / "dirs" / "a").symlink_to(run / "moved")
    assert output_dirs.listing(run, ("a",), 3).files == {"a": {}}


async def test_a_pull_run_streams_only_the_files_within_the_cap(run: Path) -> None:
    with FakeStore() as store:
        async with httpx.AsyncClient() as client:
            url = f"{store.url}/output-file/k?sig=1"
            streamer = OutputDirStreamer(client, url, run, ("a", "b"), max_files=9)
            await streamer.send(settled_only=False)
            streamed = streamer.streamed()
    assert len(streamed["a"]) == 7 and len(streamed["b"]) == 2
    assert len(store.output_files["k"]) == 9
