"""The loopback HTTP floor: a case's request and response bytes over HTTP, with no kernel.

``python -m bench.http_floor --port N`` serves an ASGI app on the worker's HTTP stack (uvicorn
with its default event loop and parser, as ``strata-kernel-worker`` runs it). For every POST it
reads the request body whole and drops it, then answers 200 with as many bytes as the
request's ``x-bench-response-bytes`` header asks for: a ``Content-Length`` and 1 MiB pieces,
as the worker sends a stored bundle. ``x-bench-received-bytes`` says how much it read, so the
client can check that the whole body arrived.

The benchmark sends it each case's own request, from the same client as the workers. For a
transfer case, ``raw + http`` (the kernel converting the data from or to a local file, plus the
bytes crossing loopback HTTP between the benchmark's client and a server on these same cores)
is what a worker that added nothing of its own would take.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

RESPONSE_BYTES_HEADER = "x-bench-response-bytes"
RECEIVED_BYTES_HEADER = "x-bench-received-bytes"
PIECE = 1 << 20

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_PIECE_BYTES = bytes(PIECE)


async def app(scope: Message, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    received = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        received += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    if scope["path"] == "/health":
        await _answer(send, 200, json.dumps({"status": "ok"}).encode(), b"application/json")
        return
    headers = dict(scope["headers"])
    try:
        wanted = int(headers.get(RESPONSE_BYTES_HEADER.encode(), b"0"))
    except ValueError:
        wanted = -1
    if wanted < 0:
        await _answer(send, 400, f"bad {RESPONSE_BYTES_HEADER}".encode(), b"text/plain")
        return
    await send({
        "type": "http.response.start",
        "status": 200,
        "headers": [
            (b"content-type", b"application/octet-stream"),
            (b"content-length", str(wanted).encode()),
            (RECEIVED_BYTES_HEADER.encode(), str(received).encode()),
        ],
    })  # fmt: skip
    while wanted > PIECE:
        await send({"type": "http.response.body", "body": _PIECE_BYTES, "more_body": True})
        wanted -= PIECE
    await send({"type": "http.response.body", "body": _PIECE_BYTES[:wanted]})


async def _answer(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m bench.http_floor", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
