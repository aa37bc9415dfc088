"""Traces over real HTTP: a worker with tracing on sends its spans to an OTLP/HTTP receiver
the test runs; one without the otel extra, or without an endpoint, sends none.

The real Strata client's side (its dispatcher span and ours in one trace) is in
tests/system/test_tracing_interop.py.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, WorkerProcess, start_worker
from tests.fake_store import FakeStore
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.wire import v1_metadata

SERVER = 2  # SpanKind.SERVER in OTLP
ERROR = 2  # Status.STATUS_CODE_ERROR
STEPS = {"worker.inputs", "worker.lease", "worker.run_cell", "worker.bundle"}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver
) -> Iterator[WorkerProcess]:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # milliseconds: spans leave promptly
        "OTEL_SERVICE_NAME": "skw-under-test",
        "STRATA_WORKER_ALLOW_LOCAL_HOSTS": "1",
    }
    w = start_worker(
        tmp_path_factory, "--pool-size", "1", "--log-format", "json", "--log-level", "info",
        env=env, capture_logs=True,
    )  # fmt: skip
    yield w
    w.stop()


def traceparent() -> tuple[str, str, str]:
    """A caller's trace context: (header, trace id, parent span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def trace_of(receiver: OtlpReceiver, trace_id: str, *names: str) -> dict[str, ReceivedSpan]:
    """The spans of ``trace_id`` by name, once every one of ``names`` arrived."""

    def arrived(spans: list[ReceivedSpan]) -> bool:
        return set(names) <= {s.name for s in spans if s.trace_id == trace_id}

    spans = receiver.wait_for(arrived, seconds=30)
    return {s.name: s for s in spans if s.trace_id == trace_id}


def post_cell(
    worker: WorkerProcess, source: str, header: str | None, **params: object
) -> httpx.Response:
    metadata = {**v1_metadata(source, **params), "build_id": f"b-{uuid.uuid4().hex[:8]}"}
    headers = {"traceparent": header, "tracestate": "vendor=1"} if header else {}
    files = {"metadata": ("metadata.json", json.dumps(metadata), "application/json")}
    return httpx.post(worker.url + "/v1/execute", files=files, headers=headers, timeout=60)


def test_a_cell_continues_its_callers_trace(traced: WorkerProcess, receiver: OtlpReceiver) -> None:
    header, trace_id, parent = traceparent()
    response = post_cell(traced, "x = 6 * 7", header)
    assert response.status_code == 200
    spans = trace_of(receiver, trace_id, "worker.execute", *STEPS)
    root = spans["worker.execute"]
    assert (root.parent_span_id, root.kind, root.service) == (parent, SERVER, "skw-under-test")
    for step in STEPS:
        assert spans[step].parent_span_id == root.span_id, step
    attributes = root.attributes
    assert attributes["build_id"].startswith("b-")
    assert attributes["worker.outcome"] == "success"
    assert attributes["http.response.status_code"] == 200
    assert attributes["http.route"] == "/v1/execute"
    assert attributes["worker.kernel.kind"] == "default"
    health = httpx.get(traced.url + "/health", timeout=10).json()
    assert attributes["worker.kernel.pid"] in traced.remember_kernels()
    assert health["pool"]["leases_served"] >= 1
    assert spans["worker.bundle"].attributes["worker.bundle.payload_bytes"] > 0


def test_log_lines_carry_the_trace_id(traced: WorkerProcess, receiver: OtlpReceiver) -> None:
    header, trace_id, _ = traceparent()
    rid = uuid.uuid4().hex
    metadata = {**v1_metadata("raise KeyError('k')"), "build_id": "b-logged"}
    files = {"metadata": ("metadata.json", json.dumps(metadata), "application/json")}
    headers = {"traceparent": header, "x-request-id": rid}
    response = httpx.post(traced.url + "/v1/execute", files=files, headers=headers, timeout=60)
    assert response.status_code == 200
    trace_of(receiver, trace_id, "worker.execute")
    deadline = time.monotonic() + 10
    while True:  # the access line is written once the response has been sent
        lines = [json.loads(line) for line in traced.logs().splitlines() if rid in line]
        messages = {line["message"]: line for line in lines}
        if any(m.startswith("POST /v1/execute") for m in messages):
            break
        assert time.monotonic() < deadline, messages
        time.sleep(0.05)
    assert "the cell raised KeyError" in messages  # a line from the job's own task
    assert any(m.startswith("POST /v1/execute 200") for m in messages)  # the access log
    assert {line.get("trace_id") for line in lines} == {trace_id}
    untraced = [json.loads(line) for line in traced.logs().splitlines() if "GET /" in line]
    assert all("trace_id" not in line for line in untraced)


def test_outcomes_and_failures_are_attributes(
    traced: WorkerProcess, receiver: OtlpReceiver
) -> None:
    header, failed_trace, _ = traceparent()
    assert post_cell(traced, "1 / 0", header).status_code == 200
    header, timed_trace, _ = traceparent()
    timed = post_cell(traced, "import time\ntime.sleep(30)", header, timeout_seconds=1)
    assert timed.status_code == 408
    failed = trace_of(receiver, failed_trace, "worker.execute")["worker.execute"]
    assert failed.attributes["worker.outcome"] == "cell_error"
    spans = trace_of(receiver, timed_trace, "worker.execute", "worker.run_cell")
    root = spans["worker.execute"]
    assert root.attributes["worker.outcome"] == "timeout"
    assert root.attributes["http.response.status_code"] == 408
    assert spans["worker.run_cell"].status_code == ERROR
    assert spans["worker.run_cell"].attributes["error.type"] == "CellTimedOut"


def test_a_request_without_context_starts_a_trace(
    traced: WorkerProcess, receiver: OtlpReceiver
) -> None:
    before = {s.span_id for s in receiver.received()}
    rid = uuid.uuid4().hex
    metadata = {**v1_metadata("y = 1"), "build_id": f"b-{rid}"}
    files = {"metadata": ("metadata.json", json.dumps(metadata), "application/json")}
    response = httpx.post(
        traced.url + "/v1/execute", files=files, headers={"x-request-id": rid}, timeout=60
    )
    assert response.status_code == 200

    def arrived(spans: list[ReceivedSpan]) -> bool:
        return any(s.attributes.get("build_id") == f"b-{rid}" for s in spans)

    root = next(
        s for s in receiver.wait_for(arrived, 30) if s.attributes.get("build_id") == f"b-{rid}"
    )
    assert root.span_id not in before and root.parent_span_id == ""


def test_a_manifest_carries_its_trace_in_its_metadata(
    traced: WorkerProcess, receiver: OtlpReceiver
) -> None:
    header, trace_id, parent = traceparent()
    key = uuid.uuid4().hex[:12]
    with FakeStore() as store:
        store.blobs[f"art-{key}"] = b"41"
        body = {
            "build_id": f"nbbuild-{key}",
            "metadata": {
                "build_id": f"nbbuild-{key}", "executor_ref": "notebook_cell@v1",
                "notebook_id": "nb-7", "cell_id": "cell-3", "traceparent": header,
                "params": {
                    "source": "y = x + 1", "timeout_seconds": 60.0,
                    "input_specs": {"x": {"uri": f"strata://artifact/art-{key}@v=3",
                                          "content_type": "json/object"}},
                },
            },
            "inputs": [{"url": f"{store.url}/blob/art-{key}", "artifact_id": f"art-{key}",
                        "version": 3}],
            "output": {"url": f"{store.url}/upload/{key}"},
            "finalize_url": f"{store.url}/finalize/{key}",
        }  # fmt: skip
        response = httpx.post(traced.url + "/v1/execute-manifest", json=body, timeout=60)
        assert response.status_code == 200, response.text
    spans = trace_of(receiver, trace_id, "worker.execute", "worker.upload", *STEPS)
    root = spans["worker.execute"]
    assert root.parent_span_id == parent
    assert (root.attributes["notebook_id"], root.attributes["cell_id"]) == ("nb-7", "cell-3")
    assert root.attributes["build_id"] == f"nbbuild-{key}"
    assert spans["worker.inputs"].attributes["worker.inputs.count"] == 1
    assert spans["worker.upload"].parent_span_id == root.span_id


# ---- tracing off ---------------------------------------------------------------------------

NO_OTEL = """\
import sys

BLOCKED = {blocked!r}


class NoOtel:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"{{name}} is blocked")


sys.meta_path.insert(0, NoOtel())
"""
EXTRA = ("opentelemetry.sdk", "opentelemetry.exporter")
"""What the otel extra installs (fastapi itself needs opentelemetry-api)."""


def test_the_package_imports_without_any_opentelemetry(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(NO_OTEL.format(blocked=("opentelemetry",)))
    code = (
        "import kernel_worker, kernel_worker.tracing, kernel_worker.logs, kernel_worker.state\n"
        "import kernel_worker.service, kernel_worker.pull.manifest, kernel_worker.settings\n"
        "from kernel_worker.tracing import OFF, from_environ\n"
        "env = {'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://127.0.0.1:9'}\n"
        "assert from_environ(env, version='1', worker_id='w') is OFF\n"
        "import opentelemetry\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr  # everything imported; only the last line failed
    assert "ImportError: opentelemetry is blocked" in run.stderr.splitlines()[-1]
    assert "the otel extra is not installed" in run.stderr


def test_the_package_imports_and_serves_without_opentelemetry(
    tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver
) -> None:
    """As installed without the extra: an endpoint set changes nothing but one warning."""
    blocker = tmp_path_factory.mktemp("no-otel")
    (blocker / "sitecustomize.py").write_text(NO_OTEL.format(blocked=EXTRA))
    env = {"PYTHONPATH": str(blocker), "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
    probe = subprocess.run(
        [sys.executable, "-c", "import opentelemetry.trace, opentelemetry.sdk"],
        env={**os.environ, **env},
        capture_output=True, check=False,
    )  # fmt: skip
    assert probe.returncode != 0  # the block works
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--log-level", "info", env=env,
                     capture_logs=True)  # fmt: skip
    try:
        header, trace_id, _ = traceparent()
        response = post_cell(w, "z = 1", header)
        assert response.status_code == 200
        logs = w.logs()
        assert "the otel extra is not installed" in logs
        assert "Traceback" not in logs
    finally:
        w.stop()
    assert all(s.trace_id != trace_id for s in receiver.received())


def test_tracing_is_off_without_an_endpoint() -> None:
    from kernel_worker import tracing

    assert tracing.from_environ({}, version="1", worker_id="w") is tracing.OFF
    with_endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    assert tracing.from_environ(with_endpoint, version="1", worker_id="w").enabled
    for off in ({"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_EXPORTER": "none"}):
        assert tracing.from_environ({**with_endpoint, **off}, version="1", worker_id="w") is (
            tracing.OFF
        )


def test_trace_context_prefers_headers_to_the_manifest() -> None:
    from kernel_worker.tracing import trace_context

    mine = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "tracestate": "x=1"}
    theirs = {"traceparent": "00-" + "c" * 32 + "-" + "d" * 16 + "-01"}
    assert trace_context(mine, theirs) == mine
    assert trace_context({}, theirs) == theirs
    assert trace_context({}, {"traceparent": 7}) == {}
    assert trace_context({}) == {}
