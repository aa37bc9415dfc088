"""A relay for ``--connect``, served over a real WebSocket on loopback.

The worker dials it; tests send HTTP requests through it with an httpx transport
(:meth:`FakeRelay.client`), so the usual wire helpers work unchanged. It speaks the relay
side of ``strata-worker-connect.v1`` (see kernel_worker/http/relay.py), refuses handshakes on
demand, can drop the worker's socket, and records the handshakes and the largest message
the worker sent. A response the caller stops reading early (or a read timeout) is sent to
the worker as an ``abort``, as a relay does when its client hangs up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import queue
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

SUBPROTOCOL = "strata-worker-connect.v1"
MAX_PAYLOAD_BYTES = 1 << 20
_END, _ABORT = object(), object()


class _Exchange:
    def __init__(self) -> None:
        self.head: concurrent.futures.Future[tuple[int, list[tuple[str, str]]]] = (
            concurrent.futures.Future()
        )
        self.body: queue.Queue[bytes | object] = queue.Queue()

    def cut(self) -> None:
        if not self.head.done():
            self.head.set_exception(httpx.RemoteProtocolError("the worker's socket closed"))
        self.body.put(_ABORT)


class FakeRelay:
    def __init__(
        self,
        *,
        token: str | None = None,
        refuse_status: int | None = None,
        subprotocol: bool = True,
        chunk_bytes: int = 256 * 1024,
        port: int | None = None,
        close_at_once: bool = False,
    ) -> None:
        self._token = token
        self._refuse_status = refuse_status
        self._subprotocol = subprotocol
        self._chunk_bytes = chunk_bytes
        self._close_at_once = close_at_once  # accept each handshake, then close the socket
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port or 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"ws://127.0.0.1:{self.port}/v1/worker-connect"
        self.handshakes: list[Headers] = []
        self.connections = 0
        self.largest_message = 0
        self._ids = itertools.count(1)
        self._exchanges: dict[int, _Exchange] = {}
        self._ws: ServerConnection | None = None
        self._connected = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._server: Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._call(self._start())

    # --- test side -------------------------------------------------------------------

    def wait_connected(self, count: int = 1, timeout: float = 60.0) -> None:
        """Wait until the worker has opened ``count`` sockets in all."""
        with self._connected:
            if not self._connected.wait_for(lambda: self.connections >= count, timeout):
                raise TimeoutError(f"the worker opened {self.connections} of {count} sockets")

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url="http://worker", transport=_Transport(self), **kwargs)

    def drop(self) -> None:
        """Close the worker's socket from the relay's side (a relay restart)."""
        ws = self._ws
        assert ws is not None, "no worker is connected"
        self._call(ws.close(1012, "restarting"))

    def close(self) -> None:
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    # --- relay side ------------------------------------------------------------------

    def _call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self) -> None:
        self._server = await serve(
            self._serve,
            sock=self._sock,
            subprotocols=[SUBPROTOCOL] if self._subprotocol else None,
            process_request=self._check,
            max_size=MAX_PAYLOAD_BYTES + 4,  # what a relay takes: a worker must chunk
        )

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def _check(self, connection: ServerConnection, request: Request) -> Response | None:
        self.handshakes.append(request.headers)
        if self._refuse_status is not None:
            return connection.respond(self._refuse_status, "refused\n")
        if self._token and request.headers.get("Authorization") != f"Bearer {self._token}":
            return connection.respond(401, "bad relay token\n")
        return None

    async def _serve(self, ws: ServerConnection) -> None:
        self._ws = ws
        with self._connected:
            self.connections += 1
            self._connected.notify_all()
        if self._close_at_once:
            await ws.close(1008, "go away")
            return
        try:
            await self._read(ws)
        except ConnectionClosed:
            pass
        finally:
            for exchange in list(self._exchanges.values()):
                exchange.cut()
            self._exchanges.clear()

    async def _read(self, ws: ServerConnection) -> None:
        async for message in ws:
            self.largest_message = max(self.largest_message, len(message))
            if isinstance(message, bytes):
                exchange = self._exchanges.get(int.from_bytes(message[:4], "big"))
                if exchange is not None:
                    exchange.body.put(message[4:])
                continue
            frame = json.loads(message)
            exchange = self._exchanges.get(frame["id"])
            if exchange is None:
                continue
            if frame["type"] == "response":
                headers = [(str(k), str(v)) for k, v in frame["headers"]]
                exchange.head.set_result((frame["status"], headers))
            elif frame["type"] == "end":
                exchange.body.put(_END)
            elif frame["type"] == "abort":
                exchange.cut()

    async def _send_request(self, stream_id: int, request: httpx.Request) -> None:
        ws = self._ws
        if ws is None:
            raise httpx.ConnectError("no worker is connected to the relay")
        frame = {
            "type": "request",
            "id": stream_id,
            "method": request.method,
            "path": request.url.raw_path.decode().split("?", 1)[0],
            "query": request.url.query.decode(),
            "headers": [[k, v] for k, v in request.headers.multi_items() if k != "host"],
        }
        await ws.send(json.dumps(frame))
        body = request.read()
        header = stream_id.to_bytes(4, "big")
        for start in range(0, len(body), self._chunk_bytes):
            await ws.send(header + body[start : start + self._chunk_bytes])
        await ws.send(json.dumps({"type": "end", "id": stream_id}))

    async def _abort(self, stream_id: int) -> None:
        self._exchanges.pop(stream_id, None)
        if self._ws is not None:
            await self._ws.send(json.dumps({"type": "abort", "id": stream_id}))

    def forward(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {}).get("read") or 120.0
        stream_id = next(self._ids)
        exchange = _Exchange()
        self._exchanges[stream_id] = exchange
        try:
            self._call(self._send_request(stream_id, request), timeout)
            status, headers = exchange.head.result(timeout)
        except concurrent.futures.TimeoutError:
            self._call(self._abort(stream_id))
            raise httpx.ReadTimeout("no response through the relay", request=request) from None
        return httpx.Response(
            status, headers=headers, stream=_Body(self, stream_id, exchange, timeout, request)
        )


class _Body(httpx.SyncByteStream):
    def __init__(
        self, relay: FakeRelay, stream_id: int, exchange: _Exchange, timeout: float, request: Any
    ) -> None:
        self._relay, self._id, self._exchange = relay, stream_id, exchange
        self._timeout, self._request = timeout, request
        self._ended = False

    def __iter__(self) -> Iterator[bytes]:
        while True:
            try:
                item = self._exchange.body.get(timeout=self._timeout)
            except queue.Empty:
                raise httpx.ReadTimeout("body stalled", request=self._request) from None
            if item is _END:
                self._ended = True
                return
            if item is _ABORT:
                self._ended = True
                raise httpx.RemoteProtocolError("the worker aborted the response")
            assert isinstance(item, bytes)
            yield item

    def close(self) -> None:
        if not self._ended:  # the caller hung up before the end: tell the worker
            self._ended = True
            self._relay._call(self._relay._abort(self._id))
        self._relay._exchanges.pop(self._id, None)


class _Transport(httpx.BaseTransport):
    def __init__(self, relay: FakeRelay) -> None:
        self._relay = relay

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._relay.forward(request)
