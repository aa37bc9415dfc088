"""``--metrics-port``: Prometheus ``GET /metrics`` without a token, on a listener of its own.

It is served by a second uvicorn server on the worker's event loop, with the same
connection limits as the main port (:mod:`.connections`: a header-read timeout, a cap on
open connections, a send timeout), so a client of this unauthenticated port can no more
hold sockets open than one of the main port. It answers ``GET`` (and ``HEAD``) of
``/metrics`` only; anything else is ``404`` or ``405``. The metrics are rendered in a
thread, as the token-gated route does, so a scrape never holds the loop.

Its socket is bound at once (:func:`start_metrics_port`), so a port in use fails the
worker's start before the kernels start. Signals stay with the main server: this one
never takes them over, and it stops with the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .connections import ConnectionLimits, fit_open_files, guarded_protocol

log = logging.getLogger("kernel_worker")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def metrics_app(registry: CollectorRegistry) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The ASGI app of the metrics port: ``GET``/``HEAD /metrics``, nothing else."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # (served without lifespan events)
            return
        headers: list[tuple[bytes, bytes]] = []
        if scope["path"] != "/metrics":
            status, body = 404, b"not found: only /metrics is served here\n"
        elif scope["method"] not in ("GET", "HEAD"):
            status, body = 405, b"method not allowed\n"
            headers.append((b"allow", b"GET, HEAD"))
        else:
            status, body = 200, await asyncio.to_thread(generate_latest, registry)
        content_type = CONTENT_TYPE_LATEST if status == 200 else "text/plain; charset=utf-8"
        headers += [
            (b"content-type", content_type.encode("latin-1")),
            (b"content-length", str(len(body)).encode("ascii")),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        if scope["method"] == "HEAD":
            body = b""
        await send({"type": "http.response.body", "body": body})

    return app


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves the process's signals to the main one."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class MetricsPort:
    """The running metrics listener; :meth:`shutdown` stops it (from the loop)."""

    def __init__(self, server: uvicorn.Server, sock: socket.socket) -> None:
        self._server = server
        self._sock = sock
        self._task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        self._task.add_done_callback(self._ended)

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("the metrics port stopped: %r", task.exception())

    def shutdown(self) -> None:
        """Stop listening and close its connections (within uvicorn's next tick)."""
        self._server.should_exit = True

    async def aclose(self) -> None:
        self.shutdown()
        # it ends by itself; a cancellation of this wait is the caller's, and is raised
        await asyncio.wait({self._task})


def _bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` as uvicorn binds one (whose own ``bind_socket``
    exits the process on a port in use, where the worker says why in one line)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def start_metrics_port(
    host: str, port: int, registry: CollectorRegistry, limits: ConnectionLimits, log_level: str
) -> MetricsPort:
    """Bind ``host:port`` now (``OSError`` when it is taken) and serve the metrics there,
    under ``limits``, on the running loop."""
    limits = ConnectionLimits(
        header_seconds=limits.header_seconds,
        max_connections=fit_open_files(limits.max_connections),
        send_seconds=limits.send_seconds,
    )
    config = uvicorn.Config(
        metrics_app(registry),
        host=host,
        port=port,
        log_level=log_level,
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
        http=guarded_protocol(limits),
        ws="none",
    )
    sock = _bind(host, port)
    try:
        return MetricsPort(_QuietServer(config), sock)
    except BaseException:
        sock.close()
        raise
