"""``--connect``: serve the worker through a relay it dials, instead of a port it binds.

A worker behind NAT or a firewall opens one WebSocket to a relay (subprotocol
``strata-worker-connect.v1``, the token of ``STRATA_WORKER_CONNECT_TOKEN`` as a bearer in
the handshake), and the relay forwards HTTP requests over it. Many requests share the
socket, each a *stream* with a numeric id:

- text messages are JSON frames: ``request`` (``id``, ``method``, ``path``, ``query``,
  ``headers`` as ``[name, value]`` pairs) and ``end``/``abort`` from the relay;
  ``response`` (``id``, ``status``, ``headers``) and ``end``/``abort`` from the worker;
- binary messages are body bytes: the stream id in 4 bytes, big-endian, then at most
  1 MiB of payload.

Each request runs through the same ASGI application a port would serve, so routes, auth,
caps and cancellation behave the same. A relay ``abort``, or the socket dropping, is the
client hanging up: the request sees ``http.disconnect`` (a running cell is cancelled, its
run directory removed). The socket is redialled with jittered exponential backoff (1 s up
to 60 s); a handshake the relay refuses with a 4xx other than 408/429, or without the
subprotocol, is final (:class:`RelayRefused`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import signal
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Scope
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHeader,
    InvalidStatus,
    WebSocketException,
)
from websockets.typing import Subprotocol

from ..cancellation import cancel_and_wait

log = logging.getLogger(__name__)

__all__ = ["MAX_PAYLOAD_BYTES", "SUBPROTOCOL", "RelayRefused", "run_connected", "serve_relay"]

SUBPROTOCOL = "strata-worker-connect.v1"
MAX_PAYLOAD_BYTES = 1 << 20  # body bytes in one binary message, after the stream id
_ID_BYTES = 4
_MAX_STREAM_ID = 1 << (8 * _ID_BYTES)
# Body chunks held per request before the socket's reader waits for the app (backpressure).
_INBOX_CHUNKS = 16
# What the relay may send in one message: a chunk, with room for relays that send more.
_MAX_MESSAGE_BYTES = 8 * MAX_PAYLOAD_BYTES + _ID_BYTES
FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 60.0
# On shutdown, after the drain: how long requests may take to send what they answered.
ANSWER_GRACE_SECONDS = 10.0
# A socket that lasted this long was a working connection: the next redial starts over.
STABLE_SECONDS = 30.0

_DISCONNECT: Message = {"type": "http.disconnect"}
_BODY_END: Message = {"type": "http.request", "body": b"", "more_body": False}
_GONE = object()  # put in an inbox when its client went away


class RelayRefused(RuntimeError):
    """The relay turned the worker away; dialling again would be refused the same way."""


class _Stream:
    """One forwarded request: its body on the way in, and whether its client is gone."""

    def __init__(self, stream_id: int) -> None:
        self.header = stream_id.to_bytes(_ID_BYTES, "big")
        self.inbox: asyncio.Queue[bytes | object | None] = asyncio.Queue(_INBOX_CHUNKS)
        self.gone = asyncio.Event()
        self.body_sent = False  # the relay's ``end`` came: no more body bytes will
        self.body_read = False  # the app received the end of the body
        self.finished = False  # the app is done with this stream

    def hang_up(self) -> None:
        if self.gone.is_set():
            return
        self.gone.set()
        self.discard_body()
        self.inbox.put_nowait(_GONE)  # wakes a receive() waiting for body bytes

    def discard_body(self) -> None:
        # frees the queue, so a reader waiting to put into it (a full inbox) moves on
        while not self.inbox.empty():
            self.inbox.get_nowait()

    def takes_body(self) -> bool:
        return not (self.body_sent or self.finished or self.gone.is_set())

    async def receive(self) -> Message:
        if self.body_read or self.gone.is_set():
            await self.gone.wait()
            return _DISCONNECT
        item = await self.inbox.get()
        if item is None:
            self.body_read = True
            return _BODY_END
        if isinstance(item, bytes):
            return {"type": "http.request", "body": item, "more_body": True}
        return _DISCONNECT


def _scope(frame: dict[str, Any]) -> Scope:
    path = frame.get("path")
    path = path if isinstance(path, str) and path.startswith("/") else "/"
    query = frame.get("query")
    method = frame.get("method")
    headers = frame.get("headers")
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method.upper() if isinstance(method, str) and method else "GET",
        "scheme": "http",
        "path": unquote(path),
        "raw_path": path.encode("latin-1", "replace"),
        "query_string": (query if isinstance(query, str) else "").encode("latin-1", "replace"),
        "root_path": "",
        "headers": [
            (_latin1(name).lower(), _latin1(value))
            for name, value in (
                pair
                for pair in (headers if isinstance(headers, list) else [])
                if isinstance(pair, list | tuple) and len(pair) == 2
            )
        ],
        "client": None,  # the caller is behind the relay; its address is not known here
        "server": None,
    }


def _latin1(value: object) -> bytes:
    return str(value).encode("latin-1", "replace")


class _Connection:
    """The requests one relay socket carries; each runs in a task of its own."""

    def __init__(self, ws: ClientConnection, app: ASGIApp, tasks: set[asyncio.Task[None]]) -> None:
        self._ws = ws
        self._app = app
        self._streams: dict[int, _Stream] = {}
        self._tasks = tasks  # outlive the socket: a request ends on its own once its client is gone

    async def serve(self) -> None:
        """Read the relay's messages until the socket closes; then every client is gone."""
        try:
            async for message in self._ws:
                if isinstance(message, bytes):
                    await self._body(message)
                else:
                    await self._frame(message)
        finally:
            for stream in self._streams.values():
                stream.hang_up()

    async def _body(self, message: bytes) -> None:
        stream = self._streams.get(int.from_bytes(message[:_ID_BYTES], "big"))
        if stream is not None and stream.takes_body():
            await stream.inbox.put(message[_ID_BYTES:])

    async def _frame(self, text: str) -> None:
        try:
            frame = json.loads(text)
        except (ValueError, RecursionError):
            log.debug("relay frame that is not JSON ignored")
            return
        if not isinstance(frame, dict):
            return
        kind, stream_id = frame.get("type"), frame.get("id")
        if not isinstance(stream_id, int) or isinstance(stream_id, bool):
            return
        if kind == "request":
            self._start(stream_id, frame)
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if kind == "end" and stream.takes_body():
            stream.body_sent = True
            await stream.inbox.put(None)
        elif kind == "abort":
            stream.hang_up()
            self._streams.pop(stream_id, None)  # the relay may use the id again

    def _start(self, stream_id: int, frame: dict[str, Any]) -> None:
        if not 0 < stream_id < _MAX_STREAM_ID or stream_id in self._streams:
            log.warning("relay request with a bad or reused stream id %s ignored", stream_id)
            return
        stream = _Stream(stream_id)
        self._streams[stream_id] = stream
        task = asyncio.create_task(self._run(stream_id, stream, _scope(frame)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, stream_id: int, stream: _Stream, scope: Scope) -> None:
        answer = _Answer(stream_id, stream, self._ws, lambda: self._release(stream_id, stream))
        try:
            await self._app(scope, stream.receive, answer.send)
        except Exception:  # the app answers its own errors; this is a bug or a lost socket
            if not stream.gone.is_set():
                log.exception("relayed %s %s failed", scope["method"], scope["path"])
        finally:
            stream.finished = True
            stream.discard_body()
            self._release(stream_id, stream)
        await answer.close()

    def _release(self, stream_id: int, stream: _Stream) -> None:
        """Forget the id once its answer is complete (what the app does after, such as
        removing the run directory, no longer holds it): the relay may use it again."""
        if self._streams.get(stream_id) is stream:
            del self._streams[stream_id]


class _Answer:
    """The ASGI ``send`` of one stream: a response frame, body chunks, then ``end``."""

    def __init__(
        self, stream_id: int, stream: _Stream, ws: ClientConnection, on_end: Callable[[], None]
    ) -> None:
        self._id = stream_id
        self._stream = stream
        self._ws = ws
        self._on_end = on_end
        self._started = False
        self._ended = False

    async def send(self, message: Message) -> None:
        if self._ended or self._stream.gone.is_set():
            return  # as under a server whose client hung up: the output goes nowhere
        if message["type"] == "http.response.start":
            self._started = True
            pairs = message.get("headers") or ()
            headers = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in pairs]
            frame = {"type": "response", "id": self._id, "status": message["status"]}
            await self._deliver(json.dumps({**frame, "headers": headers}))
        elif message["type"] == "http.response.body":
            body = memoryview(message.get("body", b""))
            for start in range(0, len(body), MAX_PAYLOAD_BYTES):
                await self._deliver(self._stream.header + body[start : start + MAX_PAYLOAD_BYTES])
            if not message.get("more_body", False):
                self._ended = True
                self._on_end()  # before the end goes out: the relay may use the id at once
                await self._deliver(json.dumps({"type": "end", "id": self._id}))

    async def close(self) -> None:
        """After the app returned: an answer it never finished is cut off, or made a 500."""
        if self._ended or self._stream.gone.is_set():
            return
        self._ended = True
        if self._started:
            await self._deliver(json.dumps({"type": "abort", "id": self._id}))
            return
        headers = [["content-type", "application/json"]]
        await self._deliver(
            json.dumps({"type": "response", "id": self._id, "status": 500, "headers": headers})
        )
        await self._deliver(self._stream.header + b'{"detail":"Internal error"}')
        await self._deliver(json.dumps({"type": "end", "id": self._id}))

    async def _deliver(self, message: str | bytes) -> None:
        try:
            await self._ws.send(message)
        except ConnectionClosed:
            self._stream.hang_up()


async def serve_relay(
    url: str, app: ASGIApp, token: str | None, tasks: set[asyncio.Task[None]] | None = None
) -> None:
    """Hold a socket to the relay at ``url`` and serve what it forwards, until cancelled.

    Each forwarded request runs as a task in ``tasks`` (a set of the caller's, to wait on).
    When cancelled (shutdown), requests still running are cancelled too; their cleanup
    (cancelling a cell, removing its run directory) is the app's, and runs shielded.

    Raises:
        RelayRefused: The relay refused the handshake with a 4xx other than 408 or 429,
            or did not choose the subprotocol.
    """
    tasks = set() if tasks is None else tasks
    try:
        await _dial(url, app, token, tasks)
    finally:  # cancelled once: a further cancellation would cut their shielded cleanup short
        await cancel_and_wait(*tasks)


async def _dial(url: str, app: ASGIApp, token: str | None, tasks: set[asyncio.Task[None]]) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    backoff = FIRST_BACKOFF_SECONDS
    loop = asyncio.get_running_loop()
    while True:
        connected_at = math.inf
        try:
            async with connect(
                url,
                additional_headers=headers,
                subprotocols=[Subprotocol(SUBPROTOCOL)],
                max_size=_MAX_MESSAGE_BYTES,
                # Bundles are gzip already. Deflated again, an incompressible 1 MiB chunk
                # grows past the 1 MiB + 4 a relay takes in one frame.
                compression=None,
            ) as ws:
                if ws.subprotocol != SUBPROTOCOL:
                    raise RelayRefused(f"the relay at {url} does not speak {SUBPROTOCOL}")
                connected_at = loop.time()
                log.info("connected to the relay at %s", url)
                try:
                    await _Connection(ws, app, tasks).serve()
                except asyncio.CancelledError:  # shutting down: say so, rather than "error"
                    await asyncio.shield(ws.close(1001, "worker shutting down"))
                    raise
            log.warning("the relay at %s closed the connection", url)
        except InvalidStatus as exc:
            status = exc.response.status_code
            if 400 <= status < 500 and status not in (408, 429):
                raise RelayRefused(f"the relay at {url} refused the worker: {status}") from None
            log.warning("the relay at %s answered HTTP %d", url, status)
        except InvalidHeader:  # its text would show the header's value: the token
            log.warning("lost the relay at %s: a handshake header it could not send", url)
        except (OSError, TimeoutError, WebSocketException) as exc:
            log.warning("lost the relay at %s: %s", url, exc)
        if loop.time() - connected_at >= STABLE_SECONDS:
            backoff = FIRST_BACKOFF_SECONDS  # a relay that drops each socket at once is not
        wait = backoff / 2 + random.uniform(0, backoff / 2)
        log.info("dialling the relay again in %.1f s", wait)
        await asyncio.sleep(wait)
        backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)


async def run_connected(app: FastAPI, url: str, token: str | None, drain_seconds: float) -> int:
    """The worker's life with ``--connect``: start the pool, serve the relay, stop on a signal.

    SIGTERM or SIGINT drains as a bound worker does (new executions get 503 through the
    relay, admitted ones get ``drain_seconds`` to finish; a second signal stops waiting),
    then the socket closes, what still runs is cancelled and the kernels shut down.
    Returns the exit status: 0 after a signal, 1 when the relay refused the worker.
    """
    signalled = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled.set)
    async with app.router.lifespan_context(app):
        requests: set[asyncio.Task[None]] = set()
        serving = asyncio.create_task(serve_relay(url, app, token, requests))
        try:
            if not await _until_signal(signalled, serving):
                try:
                    serving.result()
                except RelayRefused as exc:
                    log.error("%s", exc)
                    return 1
            signalled.clear()
            await _drain(app.state.worker, signalled, drain_seconds, requests)
        finally:
            await cancel_and_wait(serving)
    return 0


async def _drain(
    state: Any, signalled: asyncio.Event, drain_seconds: float, requests: set[asyncio.Task[None]]
) -> None:
    """Let admitted executions finish (new ones get 503) for ``drain_seconds``, or until a
    second signal; cancel what is left; give the answers a moment to go out."""
    if not await state.drain(drain_seconds, signalled):
        log.warning("stopping before every execution in flight finished; cancelling them")
        state.cancel_all()
    if requests:  # their answers (a 409 for what was cancelled) still go out
        answering = asyncio.ensure_future(asyncio.wait(set(requests), timeout=ANSWER_GRACE_SECONDS))
        await _until_signal(signalled, answering)
        answering.cancel()


async def _until_signal(signalled: asyncio.Event, work: asyncio.Future[Any]) -> bool:
    """Wait for ``work`` to end or a signal to come; True when the signal came first."""
    waiting = asyncio.ensure_future(signalled.wait())
    try:
        await asyncio.wait({work, waiting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
    return not work.done()
