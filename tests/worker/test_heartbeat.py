"""strata-pool's heartbeat on ``POST /execute`` (``--heartbeat-seconds``), over real HTTP."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import WorkerProcess, start_worker
from tests.fake_store import FakeStore
from tests.worker.test_pull import TOKEN, key, manifest, store

__all__ = ["key", "store"]  # fixtures shared with the pull model's tests

INTERVAL = 1.0
HEADER = "x-strata-status-in-body"


@pytest.fixture(scope="module")
def beating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    env = {
        "STRATA_WORKER_ALLOW_LOCAL_HOSTS": "1",
        "STRATA_WORKER_TOKEN": TOKEN,
        "STRATA_WORKER_HEARTBEAT_SECONDS": str(INTERVAL),
    }
    w = start_worker(tmp_path_factory, "--pool-size", "2", env=env)
    yield w
    w.stop()


@pytest.fixture
def client(beating: WorkerProcess) -> Iterator[httpx.Client]:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=beating.url, timeout=120, headers=auth) as c:
        yield c
    _wait_until(
        lambda: not list(beating.run_dir.glob("skw-run-*")), "a run directory outlived its request"
    )


def _wait_until(condition: Any, what: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _streamed(
    client: httpx.Client, body: dict[str, Any]
) -> tuple[httpx.Response, bytes, list[float]]:
    """POST /execute, reading the body as it comes: the response, the body, each piece's time."""
    started = time.monotonic()
    pieces: list[bytes] = []
    arrivals: list[float] = []
    with client.stream("POST", "/execute", content=json.dumps(body).encode()) as response:
        for piece in response.iter_raw():
            pieces.append(piece)
            arrivals.append(time.monotonic() - started)
    return response, b"".join(pieces), arrivals


def test_an_answer_ready_within_the_interval_is_sent_as_it_is(
    client: httpx.Client, store: FakeStore, key: str
) -> None:
    response = client.post("/execute", content=json.dumps(manifest(store, key, "result = 41 + 1")))
    assert response.status_code == 200, response.text
    assert HEADER not in response.headers
    assert response.json()["success"] is True
    assert store.bundle(key).manifest["variables"]["result"]["preview"] == 42


def test_a_quick_refusal_keeps_its_status(client: httpx.Client) -> None:
    response = client.post("/execute", content=b'{"build_id": 3}')
    assert response.status_code == 400, response.text
    assert HEADER not in response.headers
    assert response.json()["detail"]


def test_a_long_run_streams_spaces_then_its_status_and_body(
    client: httpx.Client, store: FakeStore, key: str
) -> None:
    source = "import time\ntime.sleep(3.5)\nresult = 'slept'"
    response, raw, arrivals = _streamed(client, manifest(store, key, source))
    assert response.status_code == 200
    assert response.headers[HEADER] == "1"
    assert response.headers["content-type"] == "application/json"
    spaces = len(raw) - len(raw.lstrip(b" "))
    assert spaces >= 2, raw[:80]
    assert arrivals[0] < 3.0, "the stream must start before the run ends"
    document = json.loads(raw)  # the spaces are JSON whitespace
    assert document["status_code"] == 200
    answer = json.loads(document["content"])
    assert answer["success"] is True and answer["build_id"] == f"nbbuild-{key}"
    assert answer["byte_size"] == len(store.uploads[key].body)
    assert store.finalized[key].problem is None
    assert store.bundle(key).manifest["variables"]["result"]["preview"] == "slept"


def test_a_failure_after_the_first_interval_is_reported_in_the_body(
    client: httpx.Client, store: FakeStore, key: str
) -> None:
    body = manifest(store, key, "import time\ntime.sleep(30)", params={"timeout_seconds": 2})
    response, raw, _ = _streamed(client, body)
    assert response.status_code == 200 and response.headers[HEADER] == "1"
    document = json.loads(raw)
    assert document["status_code"] == 408
    assert "timed out" in json.loads(document["content"])["detail"].lower()
    assert key not in store.uploads and key not in store.finalized


def test_a_caller_leaving_mid_stream_cancels_the_run(
    beating: WorkerProcess, client: httpx.Client, store: FakeStore, key: str
) -> None:
    body = manifest(store, key, "import time\ntime.sleep(60)\nresult = 1")
    with client.stream("POST", "/execute", content=json.dumps(body).encode()) as response:
        assert response.headers[HEADER] == "1"
        first = next(response.iter_raw())
        assert first.strip() == b""
    # the kernel running the cell is stopped and replaced; nothing is uploaded
    _wait_until(lambda: client.get("/health").json()["active_executions"] == 0,
                "the run went on after its caller left")  # fmt: skip
    assert key not in store.uploads and key not in store.finalized
    after = client.post("/execute", content=json.dumps(manifest(store, key + "b", "result = 2")))
    assert after.status_code == 200, after.text
