"""``--connect``: a worker that binds no port and serves the requests a relay forwards.

The relay is tests/fake_relay.py, on a real WebSocket; the worker is a real process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from kernel_worker.cli import settings_from
from kernel_worker.http.relay import RelayRefused, serve_relay
from tests.conftest import WorkerProcess, wait_gone
from tests.fake_relay import MAX_PAYLOAD_BYTES, FakeRelay
from tests.waiting import wait_until
from tests.wire import execute, run_ok, running_cell, wait_running

RELAY_TOKEN = "relay-secret-2f9c"
WORKER_TOKEN = "worker-token-77ab"
AUTH = {"Authorization": f"Bearer {WORKER_TOKEN}"}


def _start(
    tmp_path: Path, relay_url: str, *args: str, env: dict[str, str] | None = None
) -> WorkerProcess:
    full_env = {
        **os.environ,
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        **(env or {}),
    }
    full_env.pop("PYTEST_CURRENT_TEST", None)
    run_dir = tmp_path / "runs"
    run_dir.mkdir(exist_ok=True)
    return WorkerProcess(
        ["--connect", relay_url, "--queue-wait", "30", *args],
        full_env,
        run_dir,
        tmp_path / "worker.log",
    )


def _wait_ready(relay: FakeRelay, worker: WorkerProcess, connections: int = 1) -> None:
    relay.wait_connected(connections)
    deadline = time.monotonic() + 60
    with relay.client(timeout=10) as client:
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, "no warm kernel behind the relay"
            time.sleep(0.1)
    worker.remember_kernels()


@pytest.fixture(scope="module")
def relayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeRelay, WorkerProcess]]:
    relay = FakeRelay(token=RELAY_TOKEN)
    env = {"STRATA_WORKER_CONNECT_TOKEN": RELAY_TOKEN, "STRATA_WORKER_TOKEN": WORKER_TOKEN}
    worker = _start(tmp_path_factory.mktemp("relayed"), relay.url, "--pool-size", "2", env=env)
    try:
        _wait_ready(relay, worker)
        yield relay, worker
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(60) == 0, worker.logs()
    finally:
        worker.stop()  # fails if a kernel outlived it or a run directory was left
        relay.close()


def test_a_cell_runs_through_the_relay_with_its_inputs_and_outputs(
    relayed: tuple[FakeRelay, WorkerProcess],
) -> None:
    relay, _ = relayed
    with relay.client(timeout=60) as client:
        bundle = run_ok(
            client,
            "doubled = [x * 2 for x in xs]\nprint('hello from', len(xs))",
            [({"name": "xs", "format": "json/object", "file": "xs.json"}, b"[1, 2, 3]")],
            headers=AUTH,
        )
    assert bundle.stdout() == "hello from 3\n"
    assert json.loads(bundle.file("doubled")) == [2, 4, 6]


def test_the_worker_token_still_guards_every_route(
    relayed: tuple[FakeRelay, WorkerProcess],
) -> None:
    relay, _ = relayed
    with relay.client(timeout=60) as client:
        refused = execute(client, "x = 1")
        health = client.get("/health")
    assert refused.status_code == 401
    assert (
        refused.json()["detail"]
        == "Missing or malformed Authorization header (expected Bearer token)"
    )
    assert health.status_code == 200  # open, as on a port


def test_the_relay_token_is_sent_in_the_handshake_and_never_reaches_a_cell(
    relayed: tuple[FakeRelay, WorkerProcess],
) -> None:
    relay, worker = relayed
    assert relay.handshakes[-1]["Authorization"] == f"Bearer {RELAY_TOKEN}"
    assert relay.handshakes[-1]["Sec-WebSocket-Protocol"] == "strata-worker-connect.v1"
    source = (
        "import os\n"
        f"seen = [os.environ.get(n) for n in ('STRATA_WORKER_CONNECT_TOKEN', 'STRATA_WORKER_TOKEN')]\n"
        f"raw = open('/proc/{worker.proc.pid}/environ', 'rb').read()\n"
        f"leaked = {RELAY_TOKEN.encode()!r} in raw or {WORKER_TOKEN.encode()!r} in raw"
    )
    with relay.client(timeout=60) as client:
        bundle = run_ok(client, source, headers=AUTH)
    assert json.loads(bundle.file("seen")) == [None, None]
    assert json.loads(bundle.file("leaked")) is False


def test_large_bodies_cross_in_chunks_no_larger_than_a_relay_takes(
    relayed: tuple[FakeRelay, WorkerProcess],
) -> None:
    relay, _ = relayed
    text = os.urandom(1_500_000).hex()  # 3 MB in; 3 MB of noise (stored, not deflated) out
    source = (
        "import hashlib, os\n"
        "digest = hashlib.sha256(blob.encode()).hexdigest()\n"
        "noise = os.urandom(3_000_000)"
    )
    with relay.client(timeout=60) as client:
        bundle = run_ok(
            client,
            source,
            [
                (
                    {"name": "blob", "format": "json/object", "file": "blob.json"},
                    f'"{text}"'.encode(),
                )
            ],
            headers=AUTH,
        )
    assert json.loads(bundle.file("digest")) == hashlib.sha256(text.encode()).hexdigest()
    assert len(bundle.file("noise")) >= 3_000_000  # the bundle's gzip CRC checked every byte
    assert relay.largest_message <= MAX_PAYLOAD_BYTES + 4


def test_requests_share_the_socket_and_run_at_once(
    relayed: tuple[FakeRelay, WorkerProcess],
) -> None:
    relay, _ = relayed
    finished: dict[str, float] = {}

    def run(name: str, source: str, **kwargs: Any) -> None:
        with relay.client(timeout=60) as client:
            run_ok(client, source, headers=AUTH, **kwargs)
        finished[name] = time.monotonic()

    meta = running_cell("import time; time.sleep(2); s = 1", "slow")
    slow = threading.Thread(target=run, args=("slow", ""), kwargs={"metadata": meta})
    slow.start()
    with relay.client(timeout=60) as client:
        wait_running(client, "slow", headers=AUTH)
    run("quick", "q = 1")
    slow.join(60)
    assert finished["quick"] < finished["slow"]


def test_a_relay_abort_cancels_the_running_cell(relayed: tuple[FakeRelay, WorkerProcess]) -> None:
    relay, worker = relayed
    with relay.client(timeout=1.5) as client, pytest.raises(httpx.ReadTimeout):
        execute(client, "import time\ntime.sleep(60)\nx = 1", headers=AUTH)
    deadline = time.monotonic() + 20
    with relay.client(timeout=60) as client:
        while client.get("/health").json()["active_executions"]:
            assert time.monotonic() < deadline, "the aborted cell kept running"
            time.sleep(0.1)
        assert run_ok(client, "after = 2", headers=AUTH).file("after") == b"2"
    while list(worker.run_dir.glob("skw-run-*")):  # removed just after each answer
        assert time.monotonic() < deadline + 10, "a run directory was left behind"
        time.sleep(0.1)


def test_the_worker_dials_again_when_the_relay_drops_it(
    relayed: tuple[FakeRelay, WorkerProcess],
) -> None:
    relay, worker = relayed
    before = relay.connections
    relay.drop()
    _wait_ready(relay, worker, before + 1)
    with relay.client(timeout=60) as client:
        assert run_ok(client, "again = 3", headers=AUTH).file("again") == b"3"


def test_a_worker_started_before_its_relay_connects_once_it_listens(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nobody listens on yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    worker = _start(tmp_path, f"ws://127.0.0.1:{port}/v1/worker-connect", "--pool-size", "1")
    relay = None
    try:
        wait_until(lambda: "lost the relay at" in worker.logs(), 30, "it never dialled")
        assert worker.proc.poll() is None, worker.logs()
        relay = FakeRelay(port=port)
        _wait_ready(relay, worker)
        with relay.client(timeout=60) as client:
            assert run_ok(client, "late = 1").file("late") == b"1"
        assert "lost the relay" in worker.logs()
    finally:
        worker.stop()
        if relay is not None:
            relay.close()


def test_a_relay_that_refuses_the_worker_stops_it(tmp_path: Path) -> None:
    relay = FakeRelay(token="another")
    worker = _start(
        tmp_path, relay.url, "--pool-size", "1", env={"STRATA_WORKER_CONNECT_TOKEN": RELAY_TOKEN}
    )
    why = "refused the worker: 401"
    seen: set[int] = set()  # its kernels, while it runs
    try:
        deadline = time.monotonic() + 90
        while worker.proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(psutil.NoSuchProcess):
                seen |= {p.pid for p in psutil.Process(worker.proc.pid).children(recursive=True)}
            time.sleep(0.05)
        assert worker.proc.returncode == 1, worker.logs()
        assert why in worker.logs()
        assert seen, "the pool started before the worker dialled"
        wait_gone(seen, 10, "a kernel outlived its refused worker")
    finally:
        worker.stop()
        relay.close()


def test_sigterm_cancels_what_outlasts_the_drain_and_exits(tmp_path: Path) -> None:
    relay = FakeRelay()
    worker = _start(tmp_path, relay.url, "--pool-size", "1", "--drain-seconds", "1")
    try:
        _wait_ready(relay, worker)
        kernels = worker.remember_kernels()
        answered: dict[str, httpx.Response] = {}

        def run() -> None:
            with relay.client(timeout=90) as client:
                answered["r"] = execute(client, "import time\ntime.sleep(60)", timeout_seconds=100)

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 10
        with relay.client(timeout=10) as client:
            while client.get("/health").json()["active_executions"] < 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(30) == 0, worker.logs()
        thread.join(10)
        assert answered["r"].status_code == 409
        wait_gone(kernels, 10, "a kernel outlived its worker")
    finally:
        worker.stop()
        relay.close()


@pytest.mark.parametrize(
    ("relay_kwargs", "why"),
    [
        ({"refuse_status": 403}, "refused the worker: 403"),
        ({"refuse_status": 408}, None),  # a relay busy for now: dialled again
        ({"subprotocol": False}, "does not speak strata-worker-connect.v1"),
    ],
)
async def test_which_handshake_answers_are_final(
    relay_kwargs: dict[str, object], why: str | None
) -> None:
    relay = FakeRelay(**relay_kwargs)  # type: ignore[arg-type]
    serving = asyncio.create_task(serve_relay(relay.url, _APP, None))
    try:
        done, _ = await asyncio.wait({serving}, timeout=2.5)
        if why is None:
            assert not done and len(relay.handshakes) >= 2
        else:
            with pytest.raises(RelayRefused, match=why):
                serving.result()
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        relay.close()


@pytest.mark.parametrize(
    ("url", "token", "why"),
    [
        ("http://relay.example/", None, "--connect takes a ws:// or wss:// URL"),
        ("ws://127.0.0.1:99999/c", None, "--connect: not a usable URL"),
        ("ws:///c", None, "--connect: the URL names no host"),
        ("ws://relay.example/c", "t\u00f6k\u20acn", "STRATA_WORKER_CONNECT_TOKEN holds characters"),
        (
            "ws://relay.example/c",
            "abc\r\nX-Evil: 1",
            "STRATA_WORKER_CONNECT_TOKEN holds characters",
        ),
    ],
)
def test_connect_is_checked_before_anything_starts(
    url: str, token: str | None, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {} if token is None else {"STRATA_WORKER_CONNECT_TOKEN": token}
    with pytest.raises(SystemExit) as exited:
        settings_from(["--connect", url], env)
    assert exited.value.code == 2
    stderr = capsys.readouterr().err
    assert why in stderr
    if token is not None:
        assert token.strip() not in stderr  # a secret is never echoed


# --- the transport alone, with a small app in this process ------------------------------


async def _big(request: Request) -> Response:
    return Response(_BIG, media_type="application/octet-stream")


async def _echo(request: Request) -> Response:
    body = await request.body()
    return Response(hashlib.sha256(body).hexdigest().encode())


async def _ignore(request: Request) -> Response:
    return Response(status_code=204)  # never reads the body it was sent


async def _boom(request: Request) -> Response:
    raise RuntimeError("a bug")


async def _cut(request: Request) -> StreamingResponse:
    async def parts() -> AsyncIterator[bytes]:
        yield b"first part"
        raise RuntimeError("a bug mid-body")

    return StreamingResponse(parts())


async def _tidy(request: Request) -> Response:
    # like the worker's answers: the run directory is removed after the response is sent
    return Response(b"done", background=BackgroundTask(asyncio.sleep, 0.5))


_BIG = os.urandom(3 * MAX_PAYLOAD_BYTES + 5)
_APP = Starlette(
    routes=[
        Route("/big", _big),
        Route("/echo", _echo, methods=["POST"]),
        Route("/ignore", _ignore, methods=["POST"]),
        Route("/boom", _boom),
        Route("/cut", _cut),
        Route("/tidy", _tidy),
    ]
)


@pytest.fixture
async def in_process() -> AsyncIterator[FakeRelay]:
    relay = FakeRelay(chunk_bytes=64 * 1024)
    serving = asyncio.create_task(serve_relay(relay.url, _APP, None))
    try:
        await asyncio.to_thread(relay.wait_connected)
        yield relay
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        relay.close()


def _get(relay: FakeRelay, method: str, path: str, body: bytes = b"") -> httpx.Response:
    with relay.client(timeout=30) as client:
        return client.request(method, path, content=body)


async def test_a_body_larger_than_a_message_is_cut_into_full_chunks(in_process: FakeRelay) -> None:
    answer = await asyncio.to_thread(_get, in_process, "GET", "/big")
    assert answer.status_code == 200
    assert answer.content == _BIG
    assert in_process.largest_message == MAX_PAYLOAD_BYTES + 4


async def test_a_request_body_arrives_whole_and_in_order(in_process: FakeRelay) -> None:
    sent = os.urandom(5_000_000)
    answer = await asyncio.to_thread(_get, in_process, "POST", "/echo", sent)
    assert answer.text == hashlib.sha256(sent).hexdigest()


async def test_a_body_the_app_never_reads_does_not_stall_the_socket(in_process: FakeRelay) -> None:
    # 10 MB in 64 KiB messages: far more than a request's inbox holds
    answer = await asyncio.to_thread(_get, in_process, "POST", "/ignore", os.urandom(10_000_000))
    assert answer.status_code == 204
    after = await asyncio.to_thread(_get, in_process, "POST", "/echo", b"next")
    assert after.text == hashlib.sha256(b"next").hexdigest()


async def test_an_app_failure_is_a_500_or_a_cut_off_body(in_process: FakeRelay) -> None:
    failed = await asyncio.to_thread(_get, in_process, "GET", "/boom")
    assert failed.status_code == 500
    with pytest.raises(httpx.RemoteProtocolError, match="aborted"):
        await asyncio.to_thread(_get, in_process, "GET", "/cut")
    assert (await asyncio.to_thread(_get, in_process, "GET", "/big")).content == _BIG


async def test_a_stream_id_is_free_again_once_its_answer_has_ended(in_process: FakeRelay) -> None:
    in_process._ids = itertools.repeat(7)  # a relay that numbers every request 7
    for _ in range(3):
        answer = await asyncio.to_thread(_get, in_process, "GET", "/tidy")
        assert answer.content == b"done"


@pytest.mark.slow
async def test_a_relay_that_drops_every_socket_at_once_is_dialled_ever_more_slowly() -> None:
    relay = FakeRelay(close_at_once=True)
    serving = asyncio.create_task(serve_relay(relay.url, _APP, None))
    try:
        await asyncio.to_thread(relay.wait_connected)
        await asyncio.sleep(6)  # time passing is the point: how often it redials in 6 s
        # backing off from 1 s: redials after at least 0.5, 1.5 and 3.5 s (at most 3 in 6 s);
        # starting over at each handshake would make five or more
        assert relay.connections - 1 <= 3
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        relay.close()
