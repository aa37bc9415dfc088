"""Serving the app on a bound port: uvicorn with the worker's connection limits (see
:mod:`.connections`) and its drain on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from typing import Any

import uvicorn
from fastapi import FastAPI

from ..settings import Settings
from ..state import WorkerState
from .connections import ConnectionLimits, fit_open_files, guarded_protocol

log = logging.getLogger("kernel_worker")

#: after the drain, how long answers still being sent may take before they are cut off
CLOSE_SECONDS = 5


def bind(app: FastAPI, settings: Settings) -> tuple[uvicorn.Config, socket.socket]:
    """uvicorn's configuration for ``app``, and its socket, bound (a port in use fails here)."""
    max_connections = fit_open_files(settings.max_connections)
    if max_connections < settings.max_connections:
        log.warning(
            "the open-file limit leaves room for %d connections, not --max-connections %d: "
            "at most %d are kept open (raise the limit, e.g. ulimit -n)",
            max_connections, settings.max_connections, max_connections,
        )  # fmt: skip
    limits = ConnectionLimits(
        header_seconds=settings.header_timeout_seconds,
        max_connections=max_connections,
        send_seconds=settings.send_timeout_seconds,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # keep our handler (request ids, JSON lines)
        access_log=False,  # our middleware logs each request with its id
        # after the drain: answers still being sent (a client that stopped reading, or
        # sending) are cut off after this long, so a stop never waits on a client
        timeout_graceful_shutdown=CLOSE_SECONDS,
        http=guarded_protocol(limits),
        ws="none",  # no route takes a WebSocket: an upgrade is an ordinary request
    )
    return config, config.bind_socket()


def serve(config: uvicorn.Config, sock: socket.socket, app: FastAPI, drain_seconds: float) -> None:
    """Serve ``app`` on ``sock`` until a stop signal, draining first (see _DrainingServer)."""
    state: WorkerState = app.state.worker
    server = _DrainingServer(config, state, drain_seconds)

    def end_server() -> None:
        server.should_exit = True

    state.end_server = end_server
    server.run(sockets=[sock])


def ready_line(state: WorkerState, config: uvicorn.Config) -> str:
    """What the worker says once it serves: kernels warm, and where."""
    settings = state.settings
    kernels = settings.pool_size + settings.spares
    host = f"[{config.host}]" if ":" in config.host else config.host
    where = " (every interface)" if config.host in ("0.0.0.0", "::") else ""
    return (
        f"ready: {kernels} warm kernel{'s' if kernels != 1 else ''}, serving "
        f"http://{host}:{config.port}{where}"
    )


def _stopping(sig: int, count: int, serving: bool) -> None:
    """What a stop signal starts, said in the log (on the loop, not in the handler)."""
    name = signal.Signals(sig).name
    if not serving:
        log.warning("%s: stopping the kernels that are starting", name)
    elif count == 1:
        log.warning("%s: draining (new executions get 503), then stopping", name)
    else:
        log.warning("%s again: cancelling what is still running", name)


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, but on SIGTERM/SIGINT the worker first drains: ``/ready`` answers
    503 at once and, after ``--drain-notice`` seconds of still taking cells, new executions
    get 503 (the port still answers), admitted ones finish within ``drain_seconds``; then the
    listener closes, remaining jobs are cancelled, kernels shut down, and the process exits 0.

    A second signal (either) stops the drain's wait at once: what is running is cancelled
    and the worker goes on to shut down as above. A third SIGINT is uvicorn's force quit.
    """

    def __init__(self, config: uvicorn.Config, state: WorkerState, drain_seconds: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_seconds = drain_seconds
        self.signals = 0
        self.cut: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        # a graceful stop exits 0 (uvicorn would re-raise the signal afterwards)
        self.signals += 1
        running = asyncio._get_running_loop()  # (this runs in a signal handler)
        if running is not None:
            running.call_soon_threadsafe(_stopping, sig, self.signals, self.started)
            running.call_soon_threadsafe(self.state.stop_requested.set)
        if self.signals >= 2 and self.cut is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(self.cut.set)  # from a signal handler
        if self.signals >= 3 and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:  # the last line of a start
            log.info("%s", ready_line(self.state, self.config))

    async def shutdown(self, sockets: Any = None) -> None:
        self.loop, self.cut = asyncio.get_running_loop(), asyncio.Event()
        if self.signals >= 2:  # came before the event existed
            self.cut.set()
        await self._notice()
        drained = await self.state.drain(self.drain_seconds, self.cut)
        if not drained:
            log.warning(
                "drain %s; cancelling what is still running",
                "cut short by a second signal"
                if self.cut.is_set()
                else f"timed out after {self.drain_seconds}s",
            )
            # their requests answer 409 at once, so uvicorn's wait for open
            # connections below ends too
            self.state.cancel_all()
        await super().shutdown(sockets)

    async def _notice(self) -> None:
        """``--drain-notice``: ``/ready`` answers 503 while cells are still taken, so a load
        balancer's health check stops sending them before the drain would refuse them."""
        notice = self.state.settings.drain_notice_seconds
        self.state.withdrawn = True
        kernels = self.state.pool.stats().kernels_by_state
        if notice <= 0 or not any(kernels.get(k) for k in ("idle", "busy", "resetting")):
            return  # never ready (stopped while starting, or failed to): no balancer sends
        assert self.cut is not None
        log.warning("/ready answers 503; cells are still taken for %gs, then the drain", notice)
        with contextlib.suppress(TimeoutError):  # a second signal ends it at once
            await asyncio.wait_for(self.cut.wait(), notice)
