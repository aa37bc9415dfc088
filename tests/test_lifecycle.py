"""The worker process's life: graceful drain on SIGTERM, kernels that follow a killed worker."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from .conftest import start_worker, wait_gone
from .wire import execute, read_bundle


def test_sigterm_drains_in_flight_work_then_exits_cleanly(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    w = start_worker(tmp_path_factory, "--pool-size", "2", "--drain-seconds", "20")
    try:
        kernels = w.remember_kernels()
        with httpx.Client(base_url=w.url, timeout=60) as slow, httpx.Client(
            base_url=w.url, timeout=60
        ) as fresh:
            result: dict[str, httpx.Response] = {}
            thread = threading.Thread(
                target=lambda: result.update(r=execute(slow, "import time\ntime.sleep(2)\ndone = 1"))
            )
            thread.start()
            deadline = time.monotonic() + 10
            while fresh.get("/health").json()["active_executions"] < 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            w.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            refused = execute(fresh, "x = 1")  # the port still answers while draining
            assert refused.status_code == 503, refused.text
            assert "shutting down" in refused.json()["detail"]
            assert fresh.get("/health").json()["status"] == "draining"
            thread.join(30)
        assert read_bundle(result["r"]).variables["done"]["preview"] == 1  # finished, not cut
        assert w.proc.wait(timeout=30) == 0
        wait_gone(kernels, 10, "kernels outlived their worker")
    finally:
        w.stop()


def test_what_outlasts_the_drain_is_cancelled_and_the_worker_exits(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--drain-seconds", "1")
    try:
        kernels = w.remember_kernels()
        with httpx.Client(base_url=w.url, timeout=90) as slow, httpx.Client(
            base_url=w.url, timeout=10
        ) as probe:
            result: dict[str, httpx.Response] = {}
            thread = threading.Thread(
                target=lambda: result.update(
                    r=execute(slow, "import time\ntime.sleep(60)", timeout_seconds=100)
                )
            )
            thread.start()
            deadline = time.monotonic() + 10
            while probe.get("/health").json()["active_executions"] < 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            signalled = time.monotonic()
            w.proc.send_signal(signal.SIGTERM)
            assert w.proc.wait(timeout=30) == 0  # not after the cell's 60 s
            thread.join(10)
        assert time.monotonic() - signalled < 30
        assert result["r"].status_code == 409, result["r"].text
        assert result["r"].json()["detail"] == "execution was cancelled"
        wait_gone(kernels, 10, "kernels outlived their worker")
    finally:
        w.stop()


def test_sigkill_of_the_worker_takes_kernels_and_cell_processes_down(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    w = start_worker(tmp_path_factory, "--pool-size", "2")
    kernels = w.remember_kernels()
    with httpx.Client(base_url=w.url, timeout=5) as c:
        holder = threading.Thread(
            target=lambda: _ignore_errors(
                lambda: execute(
                    c,
                    "import subprocess, sys\n"
                    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                    "import time\ntime.sleep(60)\n",
                )
            )
        )
        holder.start()
        deadline = time.monotonic() + 10
        while len(w.remember_kernels()) <= len(kernels):  # the cell's child appeared
            assert time.monotonic() < deadline
            time.sleep(0.05)
    everything = w.remember_kernels()
    w.proc.send_signal(signal.SIGKILL)
    w.proc.wait(timeout=10)
    wait_gone(everything, 5, "kernel or cell processes outlived a killed worker")
    holder.join(10)
    # the killed worker could not remove its run directory: the next one on that run root does
    assert list(w.run_dir.glob("skw-run-*"))
    successor = start_worker(tmp_path_factory, "--pool-size", "1", run_dir=w.run_dir)
    successor.stop()
    w.stop()


def _ignore_errors(call: Callable[[], object]) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the worker is killed under this request
        call()
