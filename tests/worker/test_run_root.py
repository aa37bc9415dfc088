"""The folder run directories live in: made when missing, remade when removed, and a full
filesystem answered with a clear 507 instead of an internal error."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kernel_worker.errors import InsufficientStorage, status_for, storage_checked
from kernel_worker.settings import prepare_run_root
from tests.conftest import start_worker
from tests.wire import execute, run_ok


def test_storage_checked_turns_a_full_disk_into_507() -> None:
    for code in (errno.ENOSPC, errno.EDQUOT):
        with pytest.raises(InsufficientStorage) as caught, storage_checked("the inputs"):
            raise OSError(code, os.strerror(code))
        assert status_for(caught.value) == 507
        assert "the inputs" in caught.value.detail and "/" not in caught.value.detail


def test_storage_checked_lets_other_os_errors_through() -> None:
    with pytest.raises(PermissionError), storage_checked("the inputs"):
        raise PermissionError(errno.EACCES, "denied")


def test_prepare_run_root_makes_parents_and_refuses_files(tmp_path: Path) -> None:
    nested = tmp_path / "a" / "b" / "runs"
    assert prepare_run_root(nested) == nested and nested.is_dir()
    assert prepare_run_root(nested) == nested  # already there: fine
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        prepare_run_root(tmp_path / "file")


def test_cli_refuses_a_run_dir_it_cannot_use(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    done = subprocess.run(
        [sys.executable, "-m", "kernel_worker", "--run-dir", str(tmp_path / "file")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--run-dir" in done.stderr and "not a directory" in done.stderr


def wait_until_empty(folder: Path, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while any(folder.iterdir()):
        assert time.monotonic() < deadline, f"{folder} still holds {sorted(folder.iterdir())}"
        time.sleep(0.02)


def test_missing_run_root_is_made_and_remade(tmp_path_factory: pytest.TempPathFactory) -> None:
    top = tmp_path_factory.mktemp("gone")
    runs = top / "a" / "b" / "runs"
    w = start_worker(tmp_path_factory, "--pool-size", "1", run_dir=runs)
    try:
        assert runs.is_dir()
        with httpx.Client(base_url=w.url, timeout=120) as c:
            assert run_ok(c, "result = 1").variables["result"]["preview"] == 1
            wait_until_empty(runs)  # the first run's directory goes in the background
            shutil.rmtree(top / "a")  # a temp-dir cleaner, while the worker serves
            assert run_ok(c, "result = 2").variables["result"]["preview"] == 2
        assert runs.is_dir()
    finally:
        w.stop()


@pytest.fixture(scope="module")
def small_fs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 4 MiB tmpfs, where this machine lets the tests mount one (as root)."""
    mountpoint = tmp_path_factory.mktemp("small-fs")
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small filesystem needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mountpoint)],
        capture_output=True, timeout=30,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip("this machine does not allow mounting a tmpfs")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True, timeout=30)


def test_full_filesystem_is_507_and_the_worker_recovers(
    small_fs: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    w = start_worker(tmp_path_factory, "--pool-size", "1", run_dir=small_fs / "runs")
    try:
        with httpx.Client(base_url=w.url, timeout=120) as c:
            spec = {"name": "blob", "format": "json/object", "file": "blob.json"}
            too_big = b'"' + b"x" * (6 * 1024 * 1024) + b'"'
            response = execute(c, "n = len(blob)", [(spec, too_big)])
            assert response.status_code == 507, response.text
            detail = response.json()["detail"]
            assert "no room" in detail and str(small_fs) not in detail
            assert not list((small_fs / "runs").iterdir())  # the partial upload is gone
            fits = b'"' + b"x" * 1000 + b'"'
            bundle = run_ok(c, "n = len(blob)", [(spec, fits)])
            assert bundle.variables["n"]["preview"] == 1000
    finally:
        w.stop()
