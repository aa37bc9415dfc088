"""``--metrics-port`` under hostile connections, with raw sockets on loopback: it has the main
port's header timeout and connection cap, answers ``/metrics`` without a token throughout,
and serves nothing else."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import WorkerProcess, free_port, start_worker
from tests.worker.test_connections import (
    HALF_HEADER,
    read_until_closed,
    status_and_body,
    still_open,
)

HEADER_SECONDS = 3
MAX_CONNECTIONS = 16


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    port = free_port()
    w = start_worker(
        tmp_path_factory, "--pool-size", "1", "--metrics-port", str(port),
        "--header-timeout", str(HEADER_SECONDS), "--max-connections", str(MAX_CONNECTIONS),
        env={"STRATA_WORKER_TOKEN": "tok"},
    )  # fmt: skip
    w.metrics_port = port  # type: ignore[attr-defined]
    try:
        yield w
    finally:
        w.stop()


def _port(worker: WorkerProcess) -> int:
    return int(worker.metrics_port)  # type: ignore[attr-defined]


def _connect(worker: WorkerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", _port(worker)))


def _scrape(worker: WorkerProcess) -> httpx.Response:
    """``/metrics`` on a connection of its own, no token."""
    return httpx.get(f"http://127.0.0.1:{_port(worker)}/metrics", timeout=10)


def test_metrics_answer_without_a_token_and_nothing_else_is_served(worker: WorkerProcess) -> None:
    scraped = _scrape(worker)
    assert scraped.status_code == 200
    assert "strata_kernel_worker_" in scraped.text
    assert scraped.headers["content-type"].startswith("text/plain; version=")
    base = f"http://127.0.0.1:{_port(worker)}"
    head = httpx.head(base + "/metrics", timeout=10)
    assert head.status_code == 200 and head.content == b""
    assert httpx.get(base + "/", timeout=10).status_code == 404
    assert httpx.get(base + "/health", timeout=10).status_code == 404
    refused = httpx.post(base + "/metrics", timeout=10)
    assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD"
    assert httpx.get(worker.url + "/metrics", timeout=10).status_code == 401  # the main port's


def test_headers_that_never_end_are_closed_after_the_header_timeout(worker: WorkerProcess) -> None:
    silent = [_connect(worker) for _ in range(4)]
    slow = [_connect(worker) for _ in range(4)]
    for sock in slow:
        sock.sendall(HALF_HEADER)
    started = time.monotonic()
    try:
        for _ in range(3):  # meanwhile, scrapes are answered
            assert _scrape(worker).status_code == 200
        # bytes that keep coming do not extend the time a request's headers get
        received = read_until_closed(silent + slow, HEADER_SECONDS + 15, trickle=set(slow))
    finally:
        for sock in silent + slow:
            sock.close()
    assert time.monotonic() - started >= HEADER_SECONDS - 0.5
    assert all(received[sock] == b"" for sock in silent)
    for sock in slow:
        status, headers, body = status_and_body(received[sock])
        assert status == 408 and headers["connection"] == "close"
        assert json.loads(body)["detail"] == (
            f"The request's headers did not arrive within {HEADER_SECONDS}s"
        )
    assert _scrape(worker).status_code == 200


def test_past_the_connection_cap_the_idlest_are_closed(worker: WorkerProcess) -> None:
    silent: list[socket.socket] = []
    try:
        for _ in range(200):  # each one past the cap closes the one idle longest
            silent.append(_connect(worker))
            if len(silent) % 50 == 0:
                assert _scrape(worker).status_code == 200
        # the older ones were closed at once (long before the header timeout), answered nothing
        started = time.monotonic()
        received = read_until_closed(silent[:-MAX_CONNECTIONS], HEADER_SECONDS - 1)
        assert time.monotonic() - started < HEADER_SECONDS - 1
        assert all(data == b"" for data in received.values())
        assert still_open(silent[-1])
        assert _scrape(worker).status_code == 200
    finally:
        for sock in silent:
            sock.close()
