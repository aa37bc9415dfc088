"""Hostile connections against a real worker, with raw sockets on loopback: headers that
never end, silent sockets, more connections than the cap, a client that stops reading its
bundle, more uploads than the cap. Each is closed or refused; /health and real requests
keep working meanwhile."""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import WorkerProcess, start_worker
from tests.wire import execute, run_ok, v1_metadata

HEADER_SECONDS = 3
SEND_SECONDS = 2
HALF_HEADER = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    w = start_worker(
        tmp_path_factory, "--pool-size", "1", "--header-timeout", str(HEADER_SECONDS),
        "--send-timeout", str(SEND_SECONDS), "--max-uploads", "2",
    )  # fmt: skip
    try:
        yield w
    finally:
        w.stop()  # fails if a run directory was left behind


def fresh_client(worker: WorkerProcess) -> httpx.Client:
    """A client that opens a connection per request (none left idle to be closed)."""
    return httpx.Client(
        base_url=worker.url, timeout=60, limits=httpx.Limits(max_keepalive_connections=0)
    )


def connect(worker: WorkerProcess, *, receive_buffer: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:  # before connecting: it sets the window offered
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", worker.port))
    return sock


def read_until_closed(
    socks: list[socket.socket], seconds: float, trickle: set[socket.socket] | None = None
) -> dict[socket.socket, bytes]:
    """What each socket received until the worker closed it, waiting at most ``seconds``
    for all of them; the ``trickle`` ones send one more header byte every 0.2 s meanwhile
    (a slowloris keeps its connection busy). Fails naming how many are still open."""
    received = {sock: b"" for sock in socks}
    selector = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    open_ = set(socks)
    deadline = time.monotonic() + seconds
    next_trickle = time.monotonic()
    try:
        while open_:
            assert time.monotonic() < deadline, (
                f"{len(open_)} of {len(socks)} connections stayed open"
            )
            if trickle and time.monotonic() >= next_trickle:
                next_trickle = time.monotonic() + 0.2
                for sock in trickle & open_:
                    if received[sock]:  # answered: the worker closes it next
                        continue
                    with contextlib.suppress(OSError):  # closed: the read below sees it
                        sock.send(b"a")
            for key, _ in selector.select(timeout=0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                except BlockingIOError:
                    continue
                received[sock] += data
                if not data:
                    selector.unregister(sock)
                    open_.discard(sock)
    finally:
        selector.close()
    return received


def still_open(sock: socket.socket) -> bool:
    """Whether the worker has neither closed ``sock`` nor sent anything on it."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)  # b"": closed; bytes: something was sent
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def status_and_body(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def execute_request(
    worker: WorkerProcess, source: str, *, expect_continue: bool = False
) -> tuple[bytes, bytes]:
    """A push request's head and body, as raw bytes."""
    files = {
        "metadata": ("metadata.json", json.dumps(v1_metadata(source)).encode(), "application/json")
    }
    request = httpx.Request("POST", worker.url + "/v1/execute", files=files)
    body = request.read()
    head = ["POST /v1/execute HTTP/1.1", f"Host: 127.0.0.1:{worker.port}",
            f"Content-Type: {request.headers['content-type']}", f"Content-Length: {len(body)}"]  # fmt: skip
    if expect_continue:
        head.append("Expect: 100-continue")
    return ("\r\n".join(head) + "\r\n\r\n").encode(), body


def test_connections_that_never_finish_their_headers_are_closed(worker: WorkerProcess) -> None:
    silent = [connect(worker) for _ in range(150)]
    slow = [connect(worker) for _ in range(150)]
    for sock in slow:
        sock.sendall(HALF_HEADER)
    try:
        with fresh_client(worker) as client:  # with 300 of them open, the worker serves
            for _ in range(3):
                assert client.get("/health").status_code == 200
            assert run_ok(client, "x = 1").variables["x"]["preview"] == 1
        # bytes that keep coming do not extend the time a request's headers get
        received = read_until_closed(silent + slow, HEADER_SECONDS + 30, trickle=set(slow))
    finally:
        for sock in silent + slow:
            sock.close()
    assert all(received[sock] == b"" for sock in silent)  # nothing sent, nothing answered
    for sock in slow:
        status, headers, body = status_and_body(received[sock])
        assert status == 408 and headers["connection"] == "close"
        assert (
            json.loads(body)["detail"]
            == f"The request's headers did not arrive within {HEADER_SECONDS}s"
        )
    with fresh_client(worker) as client:
        assert client.get("/health").status_code == 200


def test_a_connection_idle_after_its_answer_and_then_slow_is_closed_too(
    worker: WorkerProcess,
) -> None:
    sock = connect(worker)
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        sock.settimeout(30)
        first = b""
        while b"\r\n\r\n" not in first:
            first += sock.recv(65536)
        _, headers, body = status_and_body(first)
        while len(body) < int(headers["content-length"]):
            body += sock.recv(65536)
        sock.sendall(HALF_HEADER)  # the next request on the same connection never ends
        received = read_until_closed([sock], HEADER_SECONDS + 30, trickle={sock})
    finally:
        sock.close()
    assert status_and_body(received[sock])[0] == 408


def test_headers_over_the_cap_are_refused(worker: WorkerProcess) -> None:
    sock = connect(worker)
    try:
        sock.sendall(HALF_HEADER + b"a" * 70_000)  # over the 64 KiB cap, and still no end
        received = read_until_closed([sock], 30)
    finally:
        sock.close()
    status, _, body = status_and_body(received[sock])
    assert status == 431 and json.loads(body)["detail"] == "The request's headers exceed 64 KiB"


def test_a_client_that_stops_reading_its_bundle_is_cut_off(worker: WorkerProcess) -> None:
    head, body = execute_request(worker, "blob = bytes(100_000_000)")
    sock = connect(worker, receive_buffer=4096)
    try:
        sock.sendall(head + body)
        sock.settimeout(60)
        got = b""
        while b"\r\n\r\n" not in got:
            got += sock.recv(4096)
        status, headers, _ = status_and_body(got)
        assert status == 200 and int(headers["content-length"]) > 100_000_000
        assert list(worker.run_dir.glob("skw-run-*")), "the bundle is sent from its run directory"
        # the client reads no more: after --send-timeout the worker gives up on it, and the
        # run directory the bundle was written from (100 MB, in memory) goes
        deadline = time.monotonic() + SEND_SECONDS + 60
        while list(worker.run_dir.glob("skw-run-*")):
            assert time.monotonic() < deadline, (
                "a client that stopped reading pinned its run directory"
            )
            time.sleep(0.05)
        received = len(got)
        with contextlib.suppress(ConnectionResetError):
            while data := sock.recv(1 << 20):
                received += len(data)
        assert received < int(headers["content-length"])  # cut off, never completed
    finally:
        sock.close()
    with fresh_client(worker) as client:
        assert run_ok(client, "y = 2").variables["y"]["preview"] == 2


def test_uploads_beyond_the_cap_are_refused_with_503(worker: WorkerProcess) -> None:
    head, body = execute_request(worker, "z = 3", expect_continue=True)
    uploads = [connect(worker) for _ in range(2)]
    try:
        for sock in uploads:  # each sends half its body, then nothing (for now)
            sock.sendall(head)
            sock.settimeout(30)
            assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")  # the body is awaited
            sock.sendall(body[: len(body) // 2])
        with fresh_client(worker) as client:
            health = client.get("/health").json()
            assert (health["active_uploads"], health["max_uploads"]) == (2, 2)
            refused = execute(client, "t = 7")
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "5"
            assert refused.json()["detail"] == "Worker is receiving 2 of 2 uploads"
            uploads[0].sendall(body[len(body) // 2 :])  # one ends: its cell runs
            answered = b""
            while b"\r\n\r\n" not in answered:
                answered += uploads[0].recv(65536)
            assert status_and_body(answered)[0] == 200
            uploads[1].close()  # the other leaves: its slot and run directory are freed
            deadline = time.monotonic() + 30
            while client.get("/health").json()["active_uploads"]:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert run_ok(client, "w = 4").variables["w"]["preview"] == 4
    finally:
        for sock in uploads:
            sock.close()


# -- the connection cap ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    w = start_worker(
        tmp_path_factory, "--pool-size", "1", "--max-connections", "4", "--header-timeout", "120"
    )
    try:
        yield w
    finally:
        w.stop()


def test_past_the_cap_the_idlest_connection_makes_room(capped: WorkerProcess) -> None:
    silent: list[socket.socket] = []
    try:
        with fresh_client(capped) as client:
            for _ in range(200):  # each new one closes the oldest idle one
                silent.append(connect(capped))
                if len(silent) % 50 == 0:
                    assert client.get("/health").status_code == 200
            assert run_ok(client, "x = 1").variables["x"]["preview"] == 1
        # the newest (three: the cell's connection took the fourth place) stay open, as
        # the 120 s header timeout is far off; every older one was closed, answered nothing
        received = read_until_closed(silent[:-4], 30)
        assert all(data == b"" for data in received.values())
        assert still_open(silent[-1])
    finally:
        for sock in silent:
            sock.close()


def test_with_every_connection_busy_a_new_one_is_refused_with_503(capped: WorkerProcess) -> None:
    head, body = execute_request(capped, "v = 5", expect_continue=True)
    busy = [connect(capped) for _ in range(4)]
    try:
        for sock in busy:  # four requests in flight: their headers are in, their bodies not
            sock.sendall(head)
            sock.settimeout(30)
            assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
        extra = connect(capped)
        busy.append(extra)  # (closed below with the others)
        received = read_until_closed([extra], 30)
        status, headers, refusal = status_and_body(received[extra])
        assert status == 503 and headers["retry-after"] == "5"
        assert (
            json.loads(refusal)["detail"]
            == "Worker has 4 connections open, each with a request in flight"
        )
        busy[0].sendall(body)  # one ends: it is answered
        answered = b""
        while b"\r\n\r\n" not in answered:
            answered += busy[0].recv(65536)
        assert status_and_body(answered)[0] == 200
    finally:
        for sock in busy:
            sock.close()
    with fresh_client(capped) as client:
        deadline = time.monotonic() + 30
        while True:  # the closed ones leave the count as the worker sees them go
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert run_ok(client, "u = 6").variables["u"]["preview"] == 6
