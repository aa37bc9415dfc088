"""What forwarding to peers may cost the worker, and what it may carry.

A worker forwards the polls and cancels it cannot answer to its ``--peers`` (see
:mod:`kernel_worker.http.fleet`). Here its peer is :class:`FakePeer`, a small real HTTP
server on loopback that records every request and answers as a test tells it: ``404``, a
``404`` that sets a cookie, ``500``, or never (it holds the connection until the worker
closes it). The worker is a real process; the tests that need limits a test can wait out
drive :class:`~kernel_worker.http.fleet.Fleet` itself, against the same fake peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from starlette.requests import Request

from kernel_worker.errors import UpstreamFailed
from kernel_worker.http.fleet import Fleet
from kernel_worker.http.peers import PeerLimits, Peers
from tests.conftest import WorkerProcess, start_worker

TOKEN = "forwarding-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PER_PEER = PeerLimits().connections_per_peer


class FakePeer:
    """A peer on loopback that records what it is sent and answers as :attr:`mode` says."""

    def __init__(self) -> None:
        self.mode = "404"
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        """(method, path, headers) of every request, in order."""
        self.accepted = 0
        """Connections opened to it."""
        self.hanging = 0
        """Requests it holds unanswered (mode ``hang``) whose connection is still open."""
        self.changed = threading.Condition()
        self._held: set[socket.socket] = set()
        peer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with peer.changed:
                    peer.accepted += 1
                    peer.changed.notify_all()

            def do_GET(self) -> None:
                peer.answer(self)

            def do_POST(self) -> None:
                peer.answer(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                pass  # the worker closed a kept-alive connection: nothing to report

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        with self.changed:
            self.requests.append((handler.command, handler.path, dict(handler.headers.items())))
            self.changed.notify_all()
        if self.mode == "hang":
            self._hold(handler.connection)
            handler.close_connection = True
            return
        status = 500 if self.mode == "500" else 404
        body = b'{"detail": "Unknown or expired job"}'
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(body)))
        if self.mode == "cookie":
            handler.send_header("set-cookie", "peer-session=secret; Path=/")
        handler.end_headers()
        handler.wfile.write(body)

    def _hold(self, connection: socket.socket) -> None:
        """Answer nothing until the worker closes the connection (or :meth:`release`)."""
        with self.changed:
            self.hanging += 1
            self._held.add(connection)
            self.changed.notify_all()
        try:
            with contextlib.suppress(OSError):
                while connection.recv(4096):
                    pass
        finally:
            with self.changed:
                self.hanging -= 1
                self._held.discard(connection)
                self.changed.notify_all()

    def wait_until(self, done: Callable[[], bool], seconds: float = 10.0) -> bool:
        with self.changed:
            return self.changed.wait_for(done, seconds)

    def notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def release(self) -> None:
        """Close every held connection (the worker's requests on them fail)."""
        with self.changed:
            for connection in self._held:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)

    def reset(self, mode: str) -> None:
        self.release()
        assert self.wait_until(lambda: self.hanging == 0)
        with self.changed:
            self.mode = mode
            self.requests.clear()
            self.accepted = 0

    def stop(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


@pytest.fixture(scope="module")
def peer() -> Iterator[FakePeer]:
    fake = FakePeer()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def forwarding(tmp_path_factory: pytest.TempPathFactory, peer: FakePeer) -> Iterator[WorkerProcess]:
    """A worker whose one peer is the fake one."""
    worker = start_worker(
        tmp_path_factory, "--pool-size", "1", "--worker-id", "w0", "--peers", peer.url,
        env={"STRATA_WORKER_TOKEN": TOKEN}, capture_logs=True,
    )  # fmt: skip
    yield worker
    worker.stop()


def _request(authorization: str = "Bearer x") -> Request:
    """The request a route hands the fleet (its headers are what is passed on)."""
    headers = [(b"authorization", authorization.encode())]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": headers})


# --- item 5: an id is one path segment ----------------------------------------------


@pytest.mark.parametrize("job_id", ["%2e%2e", "%2e", "%2E%2e"])
def test_a_dot_segment_job_id_is_refused_before_anything_is_forwarded(
    forwarding: WorkerProcess, peer: FakePeer, job_id: str
) -> None:
    """``..`` forwarded as ``/v1/jobs/..`` would reach a peer as ``GET /v1``."""
    peer.reset("404")
    response = httpx.get(f"{forwarding.url}/v1/jobs/{job_id}", headers=AUTH)
    assert response.status_code == 404, response.text
    assert "path segment" in response.json()["detail"]
    elsewhere = httpx.get(f"{forwarding.url}/v1/jobs/w1.x", headers=AUTH)
    assert elsewhere.status_code == 404  # a plain id is still asked around
    assert [path for _, path, _ in peer.requests] == ["/v1/jobs/w1.x"]


@pytest.mark.parametrize("build_id", ["%2e%2e", "%2e"])
def test_a_dot_segment_build_id_is_refused_before_anything_is_forwarded(
    forwarding: WorkerProcess, peer: FakePeer, build_id: str
) -> None:
    """``..`` forwarded as ``/v1/executions/../cancel`` would reach a peer as
    ``POST /v1/cancel``, with the client's token."""
    peer.reset("404")
    url = f"{forwarding.url}/v1/executions/{build_id}/cancel"
    response = httpx.post(url, headers=AUTH)
    assert response.status_code == 400, response.text
    assert "path segment" in response.json()["detail"]
    plain = httpx.post(f"{forwarding.url}/v1/executions/b-1/cancel", headers=AUTH)
    assert plain.json() == {"build_id": "b-1", "cancelled": False}
    assert [path for _, path, _ in peer.requests] == ["/v1/executions/b-1/cancel"]


async def test_the_fleet_itself_never_forwards_a_dot_segment(peer: FakePeer) -> None:
    peer.reset("404")
    fleet = Fleet("w0", [peer.url])
    fleet.open()
    try:
        for bad in (".", ".."):
            with pytest.raises(ValueError, match="path segment"):
                await fleet.poll(_request(), bad)
            with pytest.raises(ValueError, match="path segment"):
                await fleet.cancel(_request(), bad)
    finally:
        await fleet.aclose()
    assert peer.requests == []


# --- item 6: no cookies -------------------------------------------------------------


def test_a_peers_cookie_never_rides_on_a_later_request(
    forwarding: WorkerProcess, peer: FakePeer
) -> None:
    peer.reset("cookie")
    for job_id in ("w1.a", "w1.b"):  # another client's poll, after the cookie came
        response = httpx.get(f"{forwarding.url}/v1/jobs/{job_id}", headers=AUTH)
        assert response.status_code == 404, response.text
    cancel = httpx.post(f"{forwarding.url}/v1/executions/b-2/cancel", headers=AUTH)
    assert cancel.status_code == 200
    assert len(peer.requests) == 3
    sent = [{name.lower() for name in headers} for _, _, headers in peer.requests]
    assert all("cookie" not in names for names in sent), peer.requests


# --- item 7: outbound connections are bounded ---------------------------------------


def test_polls_to_a_hanging_peer_hold_a_bounded_number_of_sockets(
    forwarding: WorkerProcess, peer: FakePeer
) -> None:
    """40 polls at once to a peer that never answers: at most ``connections_per_peer``
    sockets go to it; the others are refused (502) once no slot frees in time."""
    peer.reset("hang")
    polls = 40

    async def scenario() -> list[httpx.Response]:
        answered = 0

        def one_more(_: object) -> None:
            nonlocal answered
            answered += 1
            peer.notify()

        async with httpx.AsyncClient(timeout=60) as client:
            tasks = [
                asyncio.ensure_future(client.get(f"{forwarding.url}/v1/jobs/w1.h{i}", headers=AUTH))
                for i in range(polls)
            ]
            for task in tasks:
                task.add_done_callback(one_more)
            settled = await asyncio.to_thread(
                peer.wait_until, lambda: peer.hanging + answered >= polls, 20
            )
            held = peer.accepted
            peer.release()  # the held polls fail now
            answers = await asyncio.gather(*tasks)
        assert settled, f"{peer.hanging} held, {answered} answered"
        assert held <= PER_PEER, f"{held} sockets to one peer"
        return answers

    answers = asyncio.run(scenario())
    assert {a.status_code for a in answers} == {502}
    assert all(peer.url.split("//")[1] not in a.text for a in answers)


async def test_a_peer_known_to_hang_fails_fast(peer: FakePeer) -> None:
    """After a peer let a request time out, requests to it fail at once for a while,
    without a socket, instead of each waiting out its own timeout."""
    peer.reset("hang")
    limits = PeerLimits(answer_seconds=0.2, hang_seconds=60.0)
    fleet = Fleet("w0", [peer.url], limits)
    fleet.open()
    try:
        with pytest.raises(UpstreamFailed):
            await fleet.poll(_request(), "w1.first")
        assert peer.accepted == 1
        started = time.monotonic()
        for i in range(20):
            with pytest.raises(UpstreamFailed):
                await fleet.poll(_request(), f"w1.next{i}")
            with pytest.raises(UpstreamFailed):
                await fleet.poll(_request(), f"w2.next{i}")  # no home: asked of every peer
            assert await fleet.cancel(_request(), f"b{i}") is False
        elapsed = time.monotonic() - started
    finally:
        await fleet.aclose()
    assert peer.accepted == 1 and len(peer.requests) == 1, peer.requests
    assert elapsed < limits.answer_seconds * 5  # 60 asks: none waited its timeout


# --- item 8: a 502 names no peer ----------------------------------------------------


def test_a_502_names_no_peer_and_the_log_says_which(
    forwarding: WorkerProcess, peer: FakePeer
) -> None:
    peer.reset("500")
    response = httpx.get(f"{forwarding.url}/v1/jobs/w1.e", headers=AUTH)
    assert response.status_code == 502, response.text
    detail = response.json()["detail"]
    host = peer.url.split("//")[1]
    assert host not in response.text and "127.0.0.1" not in response.text
    error_id = re.search(r"error ([0-9a-f]{12})", detail)
    assert error_id, detail
    assert peer.requests, "the peer was never asked"
    deadline = time.monotonic() + 10
    while True:  # the log line is written before the answer; the file may lag behind
        lines = [line for line in forwarding.logs().splitlines() if error_id[1] in line]
        if lines or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(lines) == 1 and host in lines[0] and "500" in lines[0], forwarding.logs()[-2000:]


# --- item 9: the first resolution, and a cancelled cancel ---------------------------


async def test_every_first_caller_waits_for_the_first_resolution() -> None:
    """Two first polls at once: both see what ``dns:`` names resolve to (the second
    used to get no peers while the first resolved, and answer 404)."""
    peers = Peers(["dns:localhost:9123"])
    first, second = await asyncio.gather(peers.urls(), peers.urls())
    assert first == second
    assert {"http://127.0.0.1:9123", "http://[::1]:9123"} & set(second), second


async def test_a_cancelled_cancel_stops_its_forwarded_requests(peer: FakePeer) -> None:
    peer.reset("hang")
    fleet = Fleet("w0", [peer.url])
    fleet.open()
    try:
        cancel = asyncio.ensure_future(fleet.cancel(_request(), "b-9"))
        assert await asyncio.to_thread(peer.wait_until, lambda: peer.hanging == 1)
        cancel.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await cancel
        # the forwarded request ended with it: its connection is closed, not left waiting
        closed = await asyncio.to_thread(peer.wait_until, lambda: peer.hanging == 0, 5)
        assert closed, "the forwarded cancel still runs after its cancel() was cancelled"
    finally:
        await fleet.aclose()
