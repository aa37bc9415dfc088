"""Metrics, request ids and logs, over real HTTP."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import ROOT, WorkerProcess, free_port, start_worker
from tests.wire import execute, read_bundle, run_ok


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    port = free_port()
    w = start_worker(
        tmp_path_factory, "--pool-size", "1", "--metrics-port", str(port),
        "--log-format", "json", "--log-level", "info",
        env={"STRATA_WORKER_TOKEN": "tok"}, capture_logs=True,
    )  # fmt: skip
    w.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
    yield w
    w.stop()


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_are_token_gated_and_count_executions(observed: WorkerProcess) -> None:
    auth = {"Authorization": "Bearer tok"}
    with httpx.Client(base_url=observed.url, timeout=60, headers=auth) as c:
        assert httpx.get(observed.url + "/metrics").status_code == 401
        before = c.get("/metrics").text
        run_ok(c, "x = 1")
        read = execute(c, "raise ValueError('no')")
        assert read.status_code == 200
        deadline = time.monotonic() + 10
        while True:  # the second cell's kernel goes back to the pool after the answer
            after = c.get("/metrics").text
            resets = _metric(after, "strata_kernel_worker_inline_resets_total")
            if resets >= _metric(before, "strata_kernel_worker_inline_resets_total") + 2:
                break
            assert time.monotonic() < deadline, after
            time.sleep(0.05)
    assert _metric(after, "strata_kernel_worker_reset_seconds_count") >= 2
    assert 'strata_kernel_worker_kernels{state="idle"}' in after or 'state="resetting"' in after
    name = 'strata_kernel_worker_execution_seconds_count{outcome="success"}'
    assert _metric(after, name) == _metric(before, name) + 1
    name = 'strata_kernel_worker_execution_seconds_count{outcome="cell_error"}'
    assert _metric(after, name) == _metric(before, name) + 1
    assert _metric(after, "strata_kernel_worker_input_bytes_total") > 0
    assert _metric(after, "strata_kernel_worker_bundle_bytes_total") > 0
    assert _metric(after, "strata_kernel_worker_leases_total") >= 2
    # the separate port needs no token
    separate = httpx.get(observed.metrics_url).text  # type: ignore[attr-defined]
    assert "strata_kernel_worker_kernel_retirements_total" in separate


def test_request_id_is_echoed_and_logged_without_source(observed: WorkerProcess) -> None:
    auth = {"Authorization": "Bearer tok", "X-Request-Id": "req-12345"}
    with httpx.Client(base_url=observed.url, timeout=60, headers=auth) as c:
        response = execute(c, "secret_value = 'do-not-log-me'")
        assert response.headers["x-request-id"] == "req-12345"
        generated = c.get("/health", headers={"X-Request-Id": "bad id with spaces"})
        assert len(generated.headers["x-request-id"]) == 32
    deadline = time.monotonic() + 5
    while True:  # the access line is written once the response has been sent
        lines = [json.loads(line) for line in observed.logs().splitlines() if line.startswith("{")]
        mine = [entry for entry in lines if entry["request_id"] == "req-12345"]
        if any("/v1/execute" in entry["message"] for entry in mine):
            break
        assert time.monotonic() < deadline, mine
        time.sleep(0.05)
    assert "do-not-log-me" not in observed.logs()


def test_what_a_cells_processes_print_reaches_the_cell_and_not_the_log(
    observed: WorkerProcess,
) -> None:
    source = (
        "import os, subprocess, sys\n"
        "os.system('echo fd-out-marker')\n"
        "subprocess.run([sys.executable, '-c', 'print(\"child-\" + \"marker\")'],\n"
        "               stdout=sys.stdout, check=True)\n"
        "os.write(sys.stderr.fileno(), b'fd-err-marker\\n')\n"
    )
    with httpx.Client(
        base_url=observed.url, timeout=60, headers={"Authorization": "Bearer tok"}
    ) as c:
        bundle = run_ok(c, source)
        run_ok(c, "x = 1")  # the kernel's pipe readers have long passed everything on
    assert "fd-out-marker" in bundle.stdout() and "child-marker" in bundle.stdout()
    assert "fd-err-marker" in bundle.stderr()
    logs = observed.logs()
    for marker in ("fd-out-marker", "child-marker", "fd-err-marker"):
        assert marker not in logs, logs[-2000:]


def test_a_failed_cell_is_logged_by_its_exception_type_only(observed: WorkerProcess) -> None:
    with httpx.Client(base_url=observed.url, timeout=60, headers={"Authorization": "Bearer tok",
                      "X-Request-Id": "req-failing"}) as c:  # fmt: skip
        bundle = read_bundle(execute(c, "raise KeyError('secret-key-value')"))
    assert bundle.manifest["success"] is False
    deadline = time.monotonic() + 5
    while True:
        lines = [json.loads(line) for line in observed.logs().splitlines() if line.startswith("{")]
        mine = [entry["message"] for entry in lines if entry["request_id"] == "req-failing"]
        if "the cell raised KeyError" in mine:
            break
        assert time.monotonic() < deadline, mine
        time.sleep(0.05)
    assert "secret-key-value" not in observed.logs()


async def test_an_unexpected_error_is_logged_once_under_the_request_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in a route: a 500 whose detail quotes the request id, one log line carrying it."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route

    from kernel_worker.logs import RequestIdMiddleware

    async def broken(request: object) -> None:
        raise RuntimeError("a bug")

    # as in the worker's app: inside the framework's outermost error middleware
    app = Starlette(routes=[Route("/broken", broken)], middleware=[Middleware(RequestIdMiddleware)])
    transport = httpx.ASGITransport(app=app)
    with caplog.at_level(logging.INFO):
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            response = await client.get("/broken", headers={"X-Request-Id": "req-bug"})
    assert response.status_code == 500
    assert response.json() == {"detail": "Internal error (request id req-bug)"}
    assert response.headers["x-request-id"] == "req-bug"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert "unexpected error on GET /broken" in errors[0].getMessage()


def test_python_warnings_are_log_lines_in_json_mode() -> None:
    script = (
        "import logging, warnings\nfrom kernel_worker import logs\n"
        "logs.configure('info', 'json')\nwarnings.warn('careful', RuntimeWarning)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, timeout=60, check=True)  # fmt: skip
    lines = out.stderr.splitlines()
    assert lines and all(line.startswith("{") for line in lines), out.stderr
    assert any("careful" in json.loads(line)["message"] for line in lines)


def test_openapi_documents_every_route_and_the_multipart_envelope(
    observed: WorkerProcess,
) -> None:
    schema = httpx.get(observed.url + "/openapi.json").json()
    paths = schema["paths"]
    for path in ("/health", "/v1/execute", "/v1/notebook-execute", "/v1/execute-manifest",
                 "/execute", "/v1/jobs/{job_id}", "/v1/executions/{build_id}/cancel",
                 "/v1/mount-cache/cached", "/metrics"):  # fmt: skip
        assert path in paths, path
    execute = paths["/v1/execute"]["post"]
    body = execute["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert body["required"] == ["metadata"]
    assert "application/x-tar" in execute["responses"]["200"]["content"]
    assert {"202", "400", "401", "408", "413", "502", "503"} <= set(execute["responses"])
    assert "Error" in schema["components"]["schemas"]
    manifest = paths["/v1/execute-manifest"]["post"]["requestBody"]["content"]
    assert "finalize_url" in manifest["application/json"]["schema"]["properties"]
