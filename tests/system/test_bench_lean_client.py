"""The benchmark's lean client, against the real HTTP floor and a real worker on loopback."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from bench import lean_client
from bench.cases import Case, output_case, prepare_request
from bench.http_floor import RECEIVED_BYTES_HEADER, RESPONSE_BYTES_HEADER
from bench.measure import HttpTarget, floor_runner, http_runner
from tests.conftest import ROOT, WorkerProcess, free_port, stop_process, wait_gone


@pytest.fixture
def floor_url() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.http_floor", "--port", str(port)],
                            cwd=ROOT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, "the HTTP floor exited"
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the HTTP floor did not answer"
            time.sleep(0.05)
        yield url
    finally:
        stop_process(proc, 10)
        wait_gone([proc.pid], 5, "the HTTP floor outlived the test")


def test_it_sends_the_whole_body_and_reads_the_whole_answer(floor_url: str) -> None:
    body = bytes(range(256)) * (3 * 4096 + 7)  # ~3 MB, not a multiple of any buffer size
    headers = {"content-type": "application/octet-stream", RESPONSE_BYTES_HEADER: "2500001"}
    got = lean_client.post(floor_url + "/v1/execute", body, headers, 30)
    assert got.status == 200
    assert got.headers[RECEIVED_BYTES_HEADER] == str(len(body))
    assert len(got.content) == 2_500_001
    assert got.seconds > 0


def test_it_reports_the_status_and_body_of_an_error(floor_url: str) -> None:
    got = lean_client.post(floor_url + "/x", b"", {RESPONSE_BYTES_HEADER: "-5"}, 30)
    assert got.status == 400
    assert b"x-bench-response-bytes" in got.content


def test_it_takes_only_plain_http_urls_with_a_port() -> None:
    for url in ("https://127.0.0.1:1/x", "http://127.0.0.1/x"):
        with pytest.raises(ValueError, match="lean client"):
            lean_client.post(url, b"", {}, 1)


async def test_the_floor_runner_moves_the_case_s_bytes_both_ways(floor_url: str) -> None:
    case = output_case("output_1mb", 1_000_000, "small")
    request = prepare_request(case, None)
    async with httpx.AsyncClient() as client:
        target = HttpTarget("http", floor_url, client, None)
        attempt = await floor_runner(target, case, request, lean=True)()
        assert attempt.problem is None and attempt.status == 200
        gone = HttpTarget("http", f"http://127.0.0.1:{free_port()}", client, None)
        attempt = await floor_runner(gone, case, request, lean=True)()
        assert attempt.problem is not None and attempt.problem.startswith("transport:")


async def test_a_cell_through_our_worker_is_checked_like_httpx_s(worker: WorkerProcess) -> None:
    case = output_case("output_1mb", 1_000_000, "small")
    request = prepare_request(case, None)
    async with httpx.AsyncClient(timeout=60) as client:
        target = HttpTarget("ours", worker.url, client, None)
        lean = await http_runner(target, case, request, lean=True)()
        plain = await http_runner(target, case, request)()
        assert lean.problem is None and plain.problem is None
        # a cell that fails is a problem, whichever client sent it
        broken = Case("broken", "broken", "raise ValueError('no')\n", "small",
                      expect_variable="out")  # fmt: skip
        attempt = await http_runner(target, broken, prepare_request(broken, None), lean=True)()
        assert attempt.problem is not None and "success=False" in attempt.problem
