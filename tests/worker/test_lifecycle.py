"""The worker process's life: graceful drain on SIGTERM, kernels that follow a killed worker."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import ROOT, free_port, start_worker, stop_process, wait_gone
from tests.waiting import wait_until
from tests.wire import Background, execute, read_bundle, v1_metadata, wait_active


def test_sigterm_drains_in_flight_work_then_exits_cleanly(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    w = start_worker(tmp_path_factory, "--pool-size", "2", "--drain-seconds", "20")
    try:
        kernels = w.remember_kernels()
        with (
            httpx.Client(base_url=w.url, timeout=60) as slow,
            httpx.Client(base_url=w.url, timeout=60) as fresh,
        ):
            running = Background(slow, "import time\ntime.sleep(2)\ndone = 1")
            wait_active(fresh)
            w.proc.send_signal(signal.SIGTERM)
            wait_until(lambda: fresh.get("/health").json()["status"] == "draining", 10, "no drain")
            refused = execute(fresh, "x = 1")  # the port still answers while draining
            assert refused.status_code == 503, refused.text
            assert "shutting down" in refused.json()["detail"]
            assert fresh.get("/health").json()["status"] == "draining"
            finished = running.response()
        assert read_bundle(finished).variables["done"]["preview"] == 1  # finished, not cut
        assert w.proc.wait(timeout=30) == 0
        wait_gone(kernels, 10, "kernels outlived their worker")
    finally:
        w.stop()


@pytest.mark.slow
def test_the_drain_waits_for_the_results_clients_poll_for_and_no_others(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    w = start_worker(
        tmp_path_factory, "--pool-size", "1", "--queue-wait", "0.2", "--drain-seconds", "60"
    )
    try:
        with httpx.Client(base_url=w.url, timeout=60) as c:
            running = Background(c, "import time\ntime.sleep(1.5)\nfirst = 1")
            wait_active(c)
            polled = execute(c, "queued = 2")  # no kernel free: answered 202
            abandoned = execute(c, "dropped = 3")  # its client never polls
            assert (polled.status_code, abandoned.status_code) == (202, 202), polled.text
            signalled = time.monotonic()
            w.proc.send_signal(signal.SIGTERM)
            assert read_bundle(running.response()).variables["first"]["preview"] == 1
            deadline = time.monotonic() + 20
            while (poll := c.get(polled.json()["job_url"])).headers[
                "content-type"
            ] != "application/x-tar":
                assert poll.json()["state"] in ("queued", "running"), poll.text
                assert time.monotonic() < deadline
                time.sleep(0.3)  # a client polls now and then: the worker waits for it
        assert read_bundle(poll).variables["queued"]["preview"] == 2
        assert w.proc.wait(timeout=30) == 0
        assert time.monotonic() - signalled < 30  # the abandoned result held nothing to 60 s
    finally:
        w.stop()


@pytest.mark.parametrize(
    ("drain", "second", "why"),
    [
        ("1", None, "timed out after 1.0s"),
        ("120", signal.SIGTERM, "cut short by a second signal"),
        ("120", signal.SIGINT, "cut short by a second signal"),
    ],
    ids=["deadline", "second SIGTERM", "second SIGINT"],
)
def test_what_outlasts_the_drain_is_cancelled_and_the_worker_exits(
    tmp_path_factory: pytest.TempPathFactory, drain: str, second: signal.Signals | None, why: str
) -> None:
    """At the drain's deadline, or at a second signal (SIGTERM or SIGINT), what still runs is
    cancelled; the pool is still shut down (a second SIGINT used to skip that)."""
    w = start_worker(
        tmp_path_factory,
        "--pool-size",
        "1",
        "--drain-seconds",
        drain,
        "--log-level",
        "info",
        capture_logs=True,
    )
    try:
        kernels = w.remember_kernels()
        with (
            httpx.Client(base_url=w.url, timeout=90) as slow,
            httpx.Client(base_url=w.url, timeout=10) as probe,
        ):
            running = Background(slow, "import time\ntime.sleep(60)", timeout_seconds=100)
            wait_active(probe)
            signalled = time.monotonic()
            w.proc.send_signal(signal.SIGTERM)
            if second is not None:
                deadline = time.monotonic() + 10
                while probe.get("/health").json()["status"] != "draining":  # the drain waits
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
                assert w.proc.poll() is None
                signalled = time.monotonic()
                w.proc.send_signal(second)
            assert w.proc.wait(timeout=30) == 0  # not after the cell's 60 s, nor the drain's
            cancelled = running.response(10)
        assert time.monotonic() - signalled < 30
        assert cancelled.status_code == 409, cancelled.text
        assert cancelled.json()["detail"] == "execution was cancelled"
        assert why in w.logs()
        assert "Application shutdown complete" in w.logs()  # the pool was closed, not left
        wait_gone(kernels, 10, "kernels outlived their worker")
    finally:
        w.stop()


def _worker_in_a_long_preload(tmp_path: Path) -> tuple[subprocess.Popen[bytes], set[int], Path]:
    """A worker whose template (the fork server) runs a 60 s preload before any kernel is
    forked: it, the template's process, its log."""
    preload = tmp_path / "slow.py"
    preloading = tmp_path / "preloading"
    preload.write_text(f"open({str(preloading)!r}, 'w').close()\nimport time\ntime.sleep(60)\n")
    log = tmp_path / "worker.log"
    argv = [sys.executable, "-m", "kernel_worker", "--host", "127.0.0.1", "--port",
            str(free_port()), "--pool-size", "2", "--preload", str(preload),
            "--run-dir", str(tmp_path / "runs")]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=out)
    deadline = time.monotonic() + 30
    template: set[int] = set()
    while not template or "fork server started" not in log.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
        time.sleep(0.1)
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(proc.pid).children(recursive=True)
            template = {p.pid for p in children if "_zygote.py" in " ".join(p.cmdline())}
    wait_until(preloading.exists, 30, "the preload never began")  # under way in the template
    return proc, template, log


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_during_a_long_preload_stops_the_worker_at_once(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Kernels still starting (a preload that loads a model for minutes) are stopped: the
    worker used to finish starting every kernel before it heard the signal."""
    proc, kernels, log = _worker_in_a_long_preload(tmp_path)
    try:
        signalled = time.monotonic()
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == 0, log.read_text()
        assert time.monotonic() - signalled < 10  # not the preload's 60 s
        wait_gone(kernels, 10, "kernels outlived their worker")
        text = log.read_text()
        assert f"{sig.name}: stopping the kernels that are starting" in text, text
        assert "stopped while the kernels were starting" in text and "Traceback" not in text
    finally:
        stop_process(proc, 10)


def test_sigkill_of_the_worker_during_a_long_preload_takes_its_kernels_down(
    tmp_path: Path,
) -> None:
    """The kernels' lifeline runs before the preload: they used to run on, adopted, until
    the preload ended (a model holding a GPU for minutes)."""
    proc, kernels, _ = _worker_in_a_long_preload(tmp_path)
    try:
        proc.kill()
        proc.wait(timeout=10)
        wait_gone(kernels, 10, "kernels outlived their SIGKILLed worker")
    finally:
        stop_process(proc, 10)
        for pid in kernels:  # (only if the assertion above failed)
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


def test_sigkill_of_the_worker_takes_kernels_and_cell_processes_down(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    w = start_worker(tmp_path_factory, "--pool-size", "2")
    try:
        kernels = w.remember_kernels()
        with httpx.Client(base_url=w.url, timeout=5) as c:
            # ipykernel's own watch of the worker exits a kernel alone, before the lifeline can
            # take its process group down: it raced the lifeline and left the cell's processes
            watchers = "import threading\nn = [type(t).__name__ for t in threading.enumerate()]"
            names = read_bundle(execute(c, watchers)).variables["n"]["preview"]
            assert "ParentPollerUnix" not in names
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
    except BaseException:  # stopped here, not left behind, when a check before the kill fails
        w.stop()
        raise
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


def _upload_start(port: int, body: bytes, total: int) -> socket.socket:
    """Open a POST /v1/execute that declares ``total`` body bytes and send ``body`` of them."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = (
        f"POST /v1/execute HTTP/1.1\r\nHost: x\r\nContent-Length: {total}\r\n"
        "Content-Type: multipart/form-data; boundary=b0undary\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    """The status and the whole answer (head and its ``content-length`` of body: the two
    may arrive apart)."""
    data = b""
    while not _complete(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data


def _complete(data: bytes) -> bool:
    head, found, body = data.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return True


@pytest.mark.slow
def test_clients_that_stall_do_not_hold_the_stop(tmp_path_factory: pytest.TempPathFactory) -> None:
    """After the drain, answers still being sent are cut off within a few seconds: a client
    that stopped reading its answer, or sending its upload, kept the worker up for as long
    as it kept its socket, a second SIGTERM included."""
    w = start_worker(tmp_path_factory, "--pool-size", "2", "--drain-seconds", "1")
    try:
        kernels = w.remember_kernels()
        meta = json.dumps(v1_metadata("import sys\nsys.stdout.write('x' * 40_000_000)")).encode()
        body = (
            b'--b0undary\r\nContent-Disposition: form-data; name="metadata"; '
            b'filename="metadata.json"\r\n\r\n' + meta + b"\r\n--b0undary--\r\n"
        )
        not_reading = _upload_start(w.port, body, len(body))
        not_reading.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        assert not_reading.recv(64).startswith(b"HTTP/1.1 200")  # then it reads no more
        not_sending = _upload_start(w.port, body[:40], len(body) + 1000)
        wait_until(
            lambda: httpx.get(w.url + "/health").json()["active_uploads"] >= 1,
            10,
            "the stalled upload was never received",
        )
        with not_reading, not_sending:
            signalled = time.monotonic()
            w.proc.send_signal(signal.SIGTERM)
            assert w.proc.wait(timeout=30) == 0
            assert time.monotonic() - signalled < 15  # drain 1 s, then at most 5 s more
        wait_gone(kernels, 10, "kernels outlived their worker")
    finally:
        w.stop()


def test_an_upload_that_stops_sending_is_answered_408_and_discarded(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--body-timeout", "1")
    try:
        blob = {"name": "blob", "format": "json/object", "file": "blob"}
        meta = json.dumps(v1_metadata("n = len(blob)", [blob])).encode()
        part = (
            b'--b0undary\r\nContent-Disposition: form-data; name="metadata"; '
            b'filename="metadata.json"\r\n\r\n' + meta + b"\r\n"
            b'--b0undary\r\nContent-Disposition: form-data; name="blob"; filename="blob"\r\n\r\n'
        )
        started = time.monotonic()
        with _upload_start(w.port, part + b"x" * 1000, len(part) + 1_000_000) as stalled:
            while not list(w.run_dir.glob("skw-run-*")):  # it is being staged
                assert time.monotonic() - started < 10
                time.sleep(0.02)
            status, raw = _answer(stalled)
        assert status == 408, raw
        assert b"sent nothing for 1s" in raw
        assert time.monotonic() - started < 10
        deadline = time.monotonic() + 10
        while list(w.run_dir.glob("skw-run-*")):
            assert time.monotonic() < deadline, "the stalled upload's run directory stayed"
            time.sleep(0.05)
        # an upload that keeps sending, however slowly, is not cut off
        body = part + b'"' + b"x" * 28 + b'"' + b"\r\n--b0undary--\r\n"
        total = len(body)
        slow_started = time.monotonic()
        with _upload_start(w.port, body[:10], total) as slow:
            step = total // 8 + 1
            for start in range(10, total, step):
                time.sleep(0.4)
                slow.sendall(body[start : start + step])
            status, raw = _answer(slow)
        assert status == 200, raw[:500]
        assert time.monotonic() - slow_started > 2  # it took longer than the limit, in all
    finally:
        w.stop()


def test_a_client_gone_mid_upload_is_no_error_in_the_log(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    w = start_worker(tmp_path_factory, "--pool-size", "1", capture_logs=True)
    try:
        part = (
            b'--b0undary\r\nContent-Disposition: form-data; name="blob"; filename="blob"'
            b"\r\n\r\n" + b"x" * 100_000
        )
        with _upload_start(w.port, part, 10_000_000):
            deadline = time.monotonic() + 10
            while not list(w.run_dir.glob("skw-run-*")):
                assert time.monotonic() < deadline
                time.sleep(0.02)
        while list(w.run_dir.glob("skw-run-*")):  # removed once the worker sees it gone
            assert time.monotonic() < deadline, "the abandoned upload's run directory stayed"
            time.sleep(0.02)
        with httpx.Client(base_url=w.url, timeout=30) as c:
            assert c.get("/health").status_code == 200
        time.sleep(0.2)  # time passing is the point: no error is logged after the fact
        assert "unexpected error" not in w.logs() and "Traceback" not in w.logs(), w.logs()
    finally:
        w.stop()
