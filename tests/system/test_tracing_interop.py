"""The real Strata client (strata-notebook 0.11 with its ``otel`` extra) dispatches cells to
our worker with tracing on: its ``notebook.dispatch`` span and the worker's spans land in one
trace, in an OTLP/HTTP receiver this test runs.

Needs ``STRATA_INTEROP_PYTHON`` with ``strata-notebook[notebook,otel]`` (what
``scripts/interop-env.sh`` builds); skipped only when it is unset.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import WorkerProcess, start_worker
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

INTEROP_PYTHON = os.environ.get("STRATA_INTEROP_PYTHON")
SCRIPT = Path(__file__).parents[1] / "interop" / "trace_dispatch_check.py"
STEPS = ("worker.inputs", "worker.lease", "worker.run_cell", "worker.bundle")

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(not INTEROP_PYTHON, reason="STRATA_INTEROP_PYTHON is not set"),
]


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver
) -> Iterator[WorkerProcess]:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    w = start_worker(tmp_path_factory, "--pool-size", "1", env=env)
    yield w
    w.stop()


def dispatched(receiver: OtlpReceiver, cell_id: str) -> list[ReceivedSpan]:
    """The trace of the client's dispatch of ``cell_id``, once the worker's spans are in."""

    def dispatch(spans: list[ReceivedSpan]) -> ReceivedSpan | None:
        return next(
            (
                s
                for s in spans
                if s.name == "notebook.dispatch" and s.attributes.get("cell_id") == cell_id
            ),
            None,
        )

    def complete(spans: list[ReceivedSpan]) -> bool:
        found = dispatch(spans)
        names = {s.name for s in spans if found is not None and s.trace_id == found.trace_id}
        return {"worker.execute", *STEPS} <= names

    spans = receiver.wait_for(complete, seconds=60)
    root = dispatch(spans)
    assert root is not None
    return [s for s in spans if s.trace_id == root.trace_id]


@pytest.mark.timeout(300)
def test_the_clients_trace_continues_on_the_worker(
    traced: WorkerProcess, receiver: OtlpReceiver
) -> None:
    assert INTEROP_PYTHON is not None
    proc = subprocess.run(
        [INTEROP_PYTHON, str(SCRIPT), traced.url + "/v1/execute", receiver.endpoint],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["cells"]["simple"] == {"success": True, "method": "executor"}
    assert summary["cells"]["error"]["success"] is False

    for cell_id, outcome in (("simple", "success"), ("error", "cell_error")):
        spans = {s.name: s for s in dispatched(receiver, cell_id)}
        dispatch, execute = spans["notebook.dispatch"], spans["worker.execute"]
        assert dispatch.service != execute.service  # two processes, one trace
        assert execute.parent_span_id == dispatch.span_id
        assert execute.attributes["build_id"].startswith("notebook-")  # the envelope's
        assert execute.attributes["worker.outcome"] == outcome
        assert execute.attributes["http.response.status_code"] == 200
        for step in STEPS:
            assert spans[step].parent_span_id == execute.span_id, step
        assert spans["worker.run_cell"].trace_id == dispatch.trace_id
