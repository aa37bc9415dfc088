"""What an operator meets around a running worker: its start-up lines, its access log, the
version, the token's bind address, and the metrics port as documented."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, WorkerProcess, free_port, start_worker, stop_process


@pytest.fixture(scope="module")
def talkative(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    port = free_port()
    w = start_worker(
        tmp_path_factory, "--pool-size", "1", "--log-level", "info",
        "--metrics-port", str(port), capture_logs=True,
    )  # fmt: skip
    w.metrics_url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    yield w
    w.stop()


def access_lines(worker: WorkerProcess, marker: str) -> list[str]:
    """The access-log lines so far, once ``marker`` is among them (a line is written after
    its response has been sent: waited for, bounded)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in worker.logs().splitlines() if "kernel_worker.access" in line]
        if any(marker in line for line in lines):
            return lines
        assert time.monotonic() < deadline, lines
        time.sleep(0.05)


def test_start_up_ends_with_one_ready_line(talkative: WorkerProcess) -> None:
    lines = talkative.logs().splitlines()
    ready = [i for i, line in enumerate(lines) if "] ready: " in line]
    assert len(ready) == 1, lines
    line = lines[ready[0]]
    assert line.endswith(f"ready: 1 warm kernel, serving {talkative.url}"), line
    running = next(i for i, text in enumerate(lines) if "Uvicorn running on" in text)
    complete = next(i for i, text in enumerate(lines) if "Application startup complete" in text)
    assert ready[0] > max(running, complete)  # after uvicorn's own lines


def test_probes_stay_out_of_the_access_log(talkative: WorkerProcess) -> None:
    for path in ("/ready", "/health", "/ready"):
        assert httpx.get(talkative.url + path, timeout=10).status_code == 200
    assert httpx.head(talkative.url + "/health", timeout=10).status_code == 200
    assert httpx.get(talkative.url + "/no-such-route", timeout=10).status_code == 404
    access = access_lines(talkative, "GET /no-such-route 404")  # the log is on
    assert not [line for line in access if re.search(r"(GET|HEAD) /(ready|health) ", line)]


def test_an_option_keeps_the_probes(tmp_path_factory: pytest.TempPathFactory) -> None:
    w = start_worker(
        tmp_path_factory, "--pool-size", "1", "--log-level", "info",
        "--access-log-probes", "on", capture_logs=True,
    )  # fmt: skip
    try:
        assert httpx.get(w.url + "/health", timeout=10).status_code == 200
        assert httpx.get(w.url + "/no-such-route", timeout=10).status_code == 404
        access = access_lines(w, "GET /no-such-route 404")
        assert any("GET /health 200" in line for line in access)
        assert any("GET /ready 200" in line for line in access)  # start_worker's own probe
    finally:
        w.stop()


def test_the_metrics_port_answers_as_documented(talkative: WorkerProcess) -> None:
    base: str = talkative.metrics_url  # type: ignore[attr-defined]
    assert httpx.get(base + "/metrics", timeout=10).status_code == 200
    refused = httpx.post(base + "/metrics", timeout=10)
    assert (refused.status_code, refused.headers["allow"]) == (405, "GET, HEAD")
    assert httpx.get(base + "/elsewhere", timeout=10).status_code == 404
    row = next(
        line
        for line in (ROOT / "docs" / "configuration.md").read_text().splitlines()
        if line.startswith("| `--metrics-port`")
    )
    assert "`405` with `Allow: GET, HEAD`" in row and "another path `404`" in row


def test_version() -> None:
    from kernel_worker import __version__

    run = subprocess.run(
        [sys.executable, "-m", "kernel_worker", "--version"],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    assert (run.returncode, run.stdout.strip()) == (0, f"strata-kernel-worker {__version__}")


@pytest.mark.timeout(120)
def test_a_token_moving_the_bind_address_is_said_once(tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "worker.log"
    env = {**os.environ, "STRATA_WORKER_TOKEN": "tok"}
    env.pop("STRATA_KERNEL_WORKER_HOST", None)
    argv = [sys.executable, "-m", "kernel_worker", "--port", str(port), "--pool-size", "1",
            "--run-dir", str(tmp_path), "--log-level", "info"]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=log)
    try:
        worker = WorkerProcess.__new__(WorkerProcess)  # only its readiness wait
        worker.proc, worker.url, worker.kernel_pids = proc, f"http://127.0.0.1:{port}", set()
        worker.wait_ready()
        kernels = worker.remember_kernels()
    finally:
        stop_process(proc, 30)
    text = log_path.read_text()
    assert text.count("binds 0.0.0.0 (every interface), not 127.0.0.1") == 1, text
    assert f"serving http://0.0.0.0:{port} (every interface)" in text
    assert all(not psutil_alive(pid) for pid in kernels)


def test_no_warning_when_the_host_is_chosen(talkative: WorkerProcess) -> None:
    from kernel_worker.cli import _host_given

    assert _host_given(["--host", "0.0.0.0"]) and not _host_given([])
    assert "binds 0.0.0.0" not in talkative.logs()


def psutil_alive(pid: int) -> bool:
    from tests.conftest import alive

    return alive(pid)
