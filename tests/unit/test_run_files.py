"""Files below a run directory are reached through no link, read only when regular, and
written only as new files: what a cell plants there cannot redirect the worker."""

from __future__ import annotations

import os
import stat
import tarfile
import threading
from pathlib import Path

import httpx
import pytest

from kernel_worker import service
from kernel_worker.protocol.bundle import plan_bundle
from kernel_worker.pull.output_stream import OutputDirStreamer
from kernel_worker.runs import files as run_files
from kernel_worker.runs.directory import RunDir
from tests.fake_store import FakeStore
from tests.unit.test_bundle import outcome


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run directory with ``files/x.json``, and a file outside it the cell must not reach."""
    root = tmp_path / "run"
    (root / "files").mkdir(parents=True)
    (root / "files" / "x.json").write_text("1")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("not the cell's")
    return root


def test_a_regular_file_is_read(run: Path) -> None:
    with run_files.open_regular(run, ["files", "x.json"]) as fh:
        assert fh.read() == b"1"


@pytest.mark.parametrize("where", ["leaf", "folder"])
def test_a_link_at_any_step_is_refused(run: Path, where: str) -> None:
    outside = run.parent / "outside"
    if where == "leaf":
        (run / "files" / "x.json").unlink()
        (run / "files" / "x.json").symlink_to(outside / "secret")
    else:
        (run / "files").rename(run / "moved")
        (run / "files").symlink_to(outside)
    parts = ["files", "x.json" if where == "leaf" else "secret"]
    with pytest.raises(OSError):
        run_files.open_regular(run, parts)
    if where == "folder":  # nor is a new file made through it
        with pytest.raises(OSError):
            run_files.create(run, ["files", "new.txt"])
        assert not (outside / "new.txt").exists()


def test_a_fifo_is_refused_without_waiting_for_a_writer(run: Path) -> None:
    os.mkfifo(run / "files" / "pipe")
    done = threading.Event()

    def read() -> None:
        with pytest.raises(OSError):
            run_files.open_regular(run, ["files", "pipe"])
        done.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(10)
    assert done.is_set(), "opening a FIFO waited for a writer"


@pytest.mark.parametrize("part", ["..", ".", "", "a/b"])
def test_steps_that_are_not_plain_names_are_refused(run: Path, part: str) -> None:
    with pytest.raises(OSError):
        run_files.open_regular(run, ["files", part, "x.json"])
    with pytest.raises(OSError):
        run_files.open_regular(run, [part])


@pytest.mark.parametrize("planted", ["link", "fifo", "file", "folder"])
def test_create_replaces_whatever_held_the_name_and_never_writes_through_it(
    run: Path, planted: str
) -> None:
    secret = run.parent / "outside" / "secret"
    target = run / "files" / "0.txt"
    if planted == "link":
        target.symlink_to(secret)
    elif planted == "fifo":
        os.mkfifo(target)
    elif planted == "folder":
        target.mkdir()
        (target / "inside").write_text("the cell's own")
    else:
        target.write_text("the cell's own")
    with run_files.create(run, ["files", "0.txt"]) as fh:
        fh.write(b"the worker's")
    assert secret.read_text() == "not the cell's"
    assert stat.S_ISREG(target.lstat().st_mode) and target.read_bytes() == b"the worker's"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_regular_files_lists_no_link_and_follows_none(run: Path) -> None:
    (run / "files" / "sub").mkdir()
    (run / "files" / "sub" / "b.bin").write_bytes(b"12345")
    (run / "files" / "to-secret").symlink_to(run.parent / "outside" / "secret")
    (run / "files" / "to-outside").symlink_to(run.parent / "outside")
    os.mkfifo(run / "files" / "pipe")
    found = run_files.regular_files(run, ["files"])
    assert {rel: size for rel, (size, _mtime) in found.items()} == {"x.json": 1, "sub/b.bin": 5}
    (run / "files").rename(run / "moved")
    (run / "files").symlink_to(run.parent / "outside")
    with pytest.raises(OSError):
        run_files.regular_files(run, ["files"])


async def test_an_output_file_that_became_a_link_after_listing_is_not_uploaded(run: Path) -> None:
    """The cell may swap a listed file for a link before its upload: nothing is sent (the
    next pass lists again) and the streamer goes on."""
    (run / "dirs" / "plots").mkdir(parents=True)
    link = run / "dirs" / "plots" / "a.txt"
    link.symlink_to(run.parent / "outside" / "secret")
    with FakeStore() as store:
        async with httpx.AsyncClient() as client:
            url = f"{store.url}/output-file/k?sig=1"
            streamer = OutputDirStreamer(client, url, run, ("plots",))
            await streamer._upload(("plots", "a.txt"), (14, 0))
            assert streamer.streamed() == {"plots": []}
    assert store.output_files == {}


def test_a_bundle_file_the_cell_linked_elsewhere_is_not_written_through(tmp_path: Path) -> None:
    """A pull run writes its bundle to ``bundle.tar.gz`` in the run directory: a link the
    cell put there first is moved aside, and the file it pointed at is left as it was."""
    run_dir = RunDir.make(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"only the worker's")
    (run_dir.root / "bundle.tar.gz").symlink_to(victim)
    plan = plan_bundle(run_dir.root, outcome(variables={}, displays=[], mime_displays=[]), 0)
    result = service.to_file(run_dir, None, lambda _size: None)(plan)
    assert result == run_dir.root / "bundle.tar.gz"
    assert victim.read_bytes() == b"only the worker's"
    assert stat.S_ISREG(result.lstat().st_mode)
    with tarfile.open(result) as tar:
        assert "manifest.json" in tar.getnames()
