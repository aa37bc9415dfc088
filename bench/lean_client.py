"""A lean HTTP/1.1 client for the transfer cases: what the server side can move.

The benchmark's client is ``httpx.AsyncClient``, as the Strata client's. Moving 100 MB over
loopback it is itself the slowest part: it reads a response 64 KiB at a time, each piece
passing through its async stream layers, and against a server that only drops the body it
moved 320-500 MB/s in and 230-430 MB/s out in a day's runs, at or under the 500 MB/s target
before any worker is involved (this client: 600-870 and 1,200-1,500). This client is the
standard library's ``http.client`` on a blocking socket, in a thread: one ``sendall`` of the
body, and a ``Content-Length`` response read straight into one buffer. The same prepared
request goes to the same servers, so each transfer case shows both rates side by side: the
one a Strata client sees (httpx) and the one the worker itself sustains.

Each request opens a connection of its own (~0.2 ms on loopback, nothing next to 100 MB).
"""

from __future__ import annotations

import asyncio
import http.client
import time
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class LeanResponse:
    seconds: float
    status: int
    headers: dict[str, str]
    content: bytes


def post(url: str, body: bytes, headers: dict[str, str], timeout_seconds: float) -> LeanResponse:
    """POST *body* to *url* (``http://host:port/path``) and read the whole answer (blocking)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None or parts.port is None:
        raise ValueError(f"the lean client takes http://host:port/path, not {url!r}")
    started = time.perf_counter()
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_seconds)
    try:
        conn.request("POST", parts.path or "/", body=body, headers=headers)
        response = conn.getresponse()
        content = response.read()
    finally:
        conn.close()
    seconds = time.perf_counter() - started
    return LeanResponse(seconds, response.status, {k.lower(): v for k, v in response.getheaders()},
                        content)  # fmt: skip


async def apost(
    url: str, body: bytes, headers: dict[str, str], timeout_seconds: float
) -> LeanResponse:
    """:func:`post` in a thread, so the benchmark's event loop goes on."""
    return await asyncio.to_thread(post, url, body, headers, timeout_seconds)
