"""A manifest's headers never frame or route the worker's requests (real worker, real
kernel, and a raw socket server on loopback that records the bytes that arrive)."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import WorkerProcess, start_worker


@dataclass(frozen=True)
class Arrived:
    """One request exactly as it arrived: its head's lines and its body's bytes."""

    raw: bytes
    request_line: str
    headers: list[tuple[str, str]]  # as sent: names in their case, duplicates kept
    body: bytes

    def named(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name.lower()]


class RawServer:
    """Answers each request on its own connection (``Connection: close``) and records it.

    It reads exactly what HTTP/1.1 framing says the body is (its one ``Content-Length``,
    or chunks), so a request framed twice shows up as it arrived, not as a parser fixed it.
    """

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.arrived: list[Arrived] = []
        self._closing = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve)
        self._thread.start()

    def close(self) -> None:
        self._closing = True
        socket.create_connection(("127.0.0.1", self.port), timeout=5).close()  # wakes accept()
        self._thread.join(timeout=30)
        self._sock.close()

    def requests(self, path: str) -> list[Arrived]:
        with self._lock:
            return [a for a in self.arrived if a.request_line.split(" ")[1].startswith(path)]

    def _serve(self) -> None:
        while True:
            conn, _ = self._sock.accept()
            if self._closing:
                conn.close()
                return
            with conn:
                conn.settimeout(30)
                arrived = _read_request(conn)
                with self._lock:
                    self.arrived.append(arrived)
                conn.sendall(_answer(arrived.request_line))


def _read_request(conn: socket.socket) -> Arrived:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    request_line, *lines = head.decode("latin-1").split("\r\n")
    headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines)]
    arrived = Arrived(data, request_line, headers, b"")
    lengths, encodings = arrived.named("content-length"), arrived.named("transfer-encoding")
    if encodings:
        rest = _read_chunked(conn, rest)
    elif lengths:
        while len(rest) < int(lengths[0]):
            chunk = conn.recv(65536)
            if not chunk:
                break
            rest += chunk
    return Arrived(head + b"\r\n\r\n" + rest, request_line, headers, rest)


def _read_chunked(conn: socket.socket, rest: bytes) -> bytes:
    """The raw chunked body (sizes and all), read up to its last chunk."""
    while not (rest.endswith(b"0\r\n\r\n") and (rest == b"0\r\n\r\n" or b"\r\n0\r\n\r\n" in rest)):
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return rest


def _answer(request_line: str) -> bytes:
    path = request_line.split(" ")[1]
    status, body = "200 OK", b""
    if path.startswith("/finalize"):
        body = json.dumps({"state": "ready"}).encode()
    elif path.startswith("/files"):
        status = "201 Created"
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    return head.encode() + b"Content-Type: application/json\r\n\r\n" + body


@pytest.fixture
def raw() -> Iterator[RawServer]:
    server = RawServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def puller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    w = start_worker(tmp_path_factory, "--pool-size", "1",
                     env={"STRATA_WORKER_ALLOW_LOCAL_HOSTS": "1"})  # fmt: skip
    yield w
    w.stop()


def manifest(raw: RawServer, source: str, headers: dict[str, str]) -> dict[str, Any]:
    key = uuid.uuid4().hex[:8]
    return {
        "build_id": key,
        "metadata": {"executor_ref": "notebook_cell@v1", "build_id": key,
                     "params": {"source": source, "timeout_seconds": 60, "input_specs": {}}},
        "inputs": [],
        "output": {"url": f"{raw.url}/upload/{key}", "method": "PUT", "headers": headers},
        "finalize_url": f"{raw.url}/finalize/{key}",
        "log_url": f"{raw.url}/log/{key}",
        "output_file_url": f"{raw.url}/files/{key}",
    }  # fmt: skip


HOP_BY_HOP = {"upgrade", "te", "trailer", "expect", "keep-alive"}  # the worker sends none

REFUSED = [
    "Host", "host", "Content-Length", "Transfer-Encoding", "TRANSFER-ENCODING", "Connection",
    "Upgrade", "TE", "Trailer", "Expect", "Keep-Alive", "Proxy-Authorization",
    "proxy-connection",
]  # fmt: skip


@pytest.mark.parametrize("name", REFUSED)
def test_a_header_that_frames_or_routes_the_upload_is_refused(
    puller: WorkerProcess, raw: RawServer, name: str
) -> None:
    headers = {"x-amz-meta-build": "1", name: "chunked" if "ncoding" in name else "x"}
    with httpx.Client(base_url=puller.url, timeout=120) as c:
        response = c.post("/v1/execute-manifest", json=manifest(raw, "x = 1", headers))
    assert response.status_code == 400, response.text
    assert response.json()["detail"].startswith(f"Manifest output header '{name}' may not be set")
    assert raw.arrived == []  # refused while validating: nothing went out


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ({"x-a": "b\r\nHost: metadata.internal"}, "Manifest output header 'x-a' has a line break"),
        ({"x-a": "b\nTransfer-Encoding: chunked"}, "Manifest output header 'x-a' has a line break"),
        ({"x-a\r\nHost": "b"}, "Manifest output header 'x-a\\r\\nHost' is not a valid header name"),
        ({"x a": "b"}, "Manifest output header 'x a' is not a valid header name"),
        ({":authority": "metadata.internal"}, "Manifest output header ':authority' is not a valid"),
    ],
)
def test_a_header_that_would_start_another_header_is_refused(
    puller: WorkerProcess, raw: RawServer, headers: dict[str, str], detail: str
) -> None:
    with httpx.Client(base_url=puller.url, timeout=120) as c:
        response = c.post("/v1/execute-manifest", json=manifest(raw, "x = 1", headers))
    assert response.status_code == 400, response.text
    assert response.json()["detail"].startswith(detail)
    assert raw.arrived == []


def test_every_request_a_manifest_shapes_is_framed_once_by_the_worker(
    puller: WorkerProcess, raw: RawServer
) -> None:
    """Upload, finalize, console and output-file requests, byte for byte: one Host (the
    URL's), one framing (a Content-Length that matches the body, or chunks), and the
    manifest's own headers on the upload only."""
    source = "# @output_dir plots\n(plots / 'a.txt').write_text('alpha')\nprint('hello')\nx = 1"
    headers = {"x-amz-meta-build": "b1", "x-ms-blob-type": "BlockBlob"}
    with httpx.Client(base_url=puller.url, timeout=120) as c:
        response = c.post("/v1/execute-manifest", json=manifest(raw, source, headers))
    assert response.status_code == 200, response.text
    kinds = {path: raw.requests(path) for path in ("/upload", "/finalize", "/log", "/files")}
    assert {path: len(found) > 0 for path, found in kinds.items()} == dict.fromkeys(kinds, True)
    for arrived in raw.arrived:
        assert arrived.named("host") == [f"127.0.0.1:{raw.port}"], arrived.raw[:2000]
        lengths, chunked = arrived.named("content-length"), arrived.named("transfer-encoding")
        assert len(lengths) + len(chunked) == 1, arrived.raw[:2000]  # exactly one framing
        if lengths:
            assert int(lengths[0]) == len(arrived.body)
        else:
            assert chunked == ["chunked"] and arrived.body.endswith(b"0\r\n\r\n")
        names = [key.lower() for key, _ in arrived.headers]
        assert arrived.named("connection") == ["keep-alive"]  # the worker's client's own
        assert not [n for n in names if n in HOP_BY_HOP or n.startswith("proxy-")]
    (upload,) = kinds["/upload"]
    assert upload.request_line.startswith("PUT ")
    assert upload.named("x-amz-meta-build") == ["b1"]
    assert upload.named("x-ms-blob-type") == ["BlockBlob"]
    assert upload.named("content-type") == ["application/x-tar"]
    assert upload.body[:2] == b"\x1f\x8b"  # the gzipped bundle, nothing before it
    for path in ("/finalize", "/log", "/files"):
        assert not [a for a in kinds[path] if a.named("x-amz-meta-build")]
