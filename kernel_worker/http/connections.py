"""The worker's HTTP connections: how long a request's headers may take to arrive, how many
connections may be open at once, and how long a client may read nothing of its answer.

uvicorn arms no timer while a request's headers arrive: its keep-alive timeout runs only
between requests, and any byte stops it. So a client that connects and sends nothing, or
half a header and then nothing, holds its socket until it closes it, with no token needed.
Its ``limit_concurrency`` does not help: it answers ``503`` to *requests* once that many
connections are open, which hands the worker to whoever holds idle sockets; h11's
``h11_max_incomplete_event_size`` caps the size of a header, not the time it takes.

:class:`GuardedProtocol`, uvicorn's httptools protocol with the worker's limits
(:func:`guarded_protocol`):

- closes a connection whose request headers are not all in ``header_seconds`` after its
  first byte (after the connection opened, for its first request), answering ``408`` when
  part of a request came, and answers ``431`` to headers over :data:`MAX_HEADER_BYTES`. The
  rest of a body sent after its request was answered (a ``401``, a ``413``) may not pause
  for ``header_seconds`` either;
- keeps at most ``max_connections`` open: one more closes the connection that has waited
  longest for a request (idle between requests, or still sending its headers); when every
  open connection has a request in flight, the new one is answered ``503`` with
  ``Retry-After`` and closed;
- aborts a connection whose answer could not move for ``send_seconds`` (a client that
  stopped reading): the answer sees its client gone and stops, so a bundle's run directory
  is removed instead of staying pinned as long as the socket.

It builds on the protocol's parser callbacks (``on_message_begin``,
``on_headers_complete``), its ``on_response_complete`` and the transport's flow control.
"""

from __future__ import annotations

import asyncio
import http
import itertools
import json
import logging
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 * 1024
"""A request's line and headers, together (uvicorn's h11 takes 16 KiB, nginx 32 KiB)."""
RETRY_AFTER_SECONDS = 5
FD_RESERVE = 512
"""Open files kept for the worker's own use beside its connections (kernels' sockets,
run files, the metrics port)."""
_MIN_CONNECTIONS = 64


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_seconds: float = 10.0
    max_connections: int = 1024
    send_seconds: float = 60.0


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under :attr:`limits` (see the module)."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    serials: ClassVar[Iterator[int]] = itertools.count()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting_since: int | None = None
        """While no request is in flight, when it began to wait for one: a number from the
        server's count (the loop's clock may give connections accepted together one time)."""
        self._deadline: float | None = None
        """When the awaited request's headers (or the rest of an answered body) are late."""
        self._late: asyncio.TimerHandle | None = None  # looks at _deadline
        self._in_headers = False
        self._header_bytes = 0
        self._stalled: asyncio.TimerHandle | None = None  # watches a paused answer
        self._sending_mark = (0.0, 0)  # (loop time, bytes waiting to be sent) at last progress

    # -- the connection ------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:  # the transport type uvicorn's takes
        super().connection_made(transport)
        now = self.loop.time()
        self._waiting_since = next(self.serials)
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            log.warning(
                "%d connections open, each with a request in flight: refused one "
                "(--max-connections)",
                self.limits.max_connections,
            )
            self.connections.discard(self)
            self._waiting_since = None
            detail = (
                f"Worker has {self.limits.max_connections} connections open, each with a "
                "request in flight"
            )
            self._answer_and_close(503, detail, retry_after=RETRY_AFTER_SECONDS)
            return
        self._expect_request(now)

    def connection_lost(self, exc: Exception | None) -> None:
        self._waiting_since = self._deadline = None
        for timer in (self._late, self._stalled):
            if timer is not None:
                timer.cancel()
        self._late = self._stalled = None
        super().connection_lost(exc)

    def _make_room(self) -> bool:
        """Close the open connection that has waited longest for a request; False if none."""
        waiting = [
            other
            for other in self.connections
            if isinstance(other, GuardedProtocol)
            and other is not self
            and other._waiting_since is not None
        ]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda other: other._waiting_since or 0)
        log.debug("%d connections open: closed the one idle longest", len(self.connections))
        oldest._waiting_since = None  # never chosen twice
        self.connections.discard(oldest)  # counted out now; aborting completes on the loop
        oldest.transport.abort()
        return True

    # -- a request's headers -------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._waiting_since is not None:  # no request in flight: these bytes start one
            now = self.loop.time()
            if self.cycle is not None and self.cycle.more_body:  # the rest of an answered body
                self._deadline = now + self.limits.header_seconds  # may not pause that long
                if self._late is None:
                    self._late = self.loop.call_at(self._deadline, self._look)
            else:
                self._expect_request(now)
        super().data_received(data)
        if self._in_headers and not self.transport.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > MAX_HEADER_BYTES:
                detail = f"The request's headers exceed {MAX_HEADER_BYTES // 1024} KiB"
                self._answer_and_close(431, detail)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        self._header_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._waiting_since = self._deadline = None
        if self._late is not None:
            self._late.cancel()
            self._late = None
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle is None or self.cycle.response_complete:  # none pipelined behind it
            self._waiting_since = next(self.serials)

    def _expect_request(self, start: float) -> None:
        """A request's headers are due ``header_seconds`` after ``start`` (if not already)."""
        if self._deadline is None:
            self._deadline = start + self.limits.header_seconds
            self._late = self.loop.call_at(self._deadline, self._look)

    def _look(self) -> None:
        self._late = None
        if self._deadline is None or self.transport.is_closing():
            return
        if self.loop.time() < self._deadline:  # the rest of a body moved: a later deadline
            self._late = self.loop.call_at(self._deadline, self._look)
            return
        self._deadline = None
        seconds = self.limits.header_seconds
        if self._in_headers:
            log.debug("closed a connection whose request headers took over %gs", seconds)
            detail = f"The request's headers did not arrive within {seconds:g}s"
            self._answer_and_close(408, detail)
        else:  # nothing came, or the rest of an answered body stopped
            log.debug("closed a connection that sent no request within %gs", seconds)
            self._close()

    def _answer_and_close(self, status: int, detail: str, *, retry_after: int = 0) -> None:
        """Answer ``status`` with a JSON ``detail`` (the worker's error shape) and close."""
        body = json.dumps({"detail": detail}).encode()
        head = [
            f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
            "content-type: application/json",
            f"content-length: {len(body)}",
            "connection: close",
        ]
        if retry_after:
            head.append(f"retry-after: {retry_after}")
        self.transport.write("\r\n".join(head).encode() + b"\r\n\r\n" + body)
        self._close()

    def _close(self) -> None:
        """Close once what is buffered has gone, unless the client is not reading it."""
        if self.transport.get_write_buffer_size():
            self.transport.abort()
        else:
            self.transport.close()

    # -- sending an answer ---------------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stalled is None:
            self._sending_mark = (self.loop.time(), self.transport.get_write_buffer_size())
            self._stalled = self.loop.call_later(self._send_check_seconds(), self._check_sending)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _send_check_seconds(self) -> float:
        return max(0.05, min(1.0, self.limits.send_seconds / 4))

    def _check_sending(self) -> None:
        """While the answer waits for the client: abort once nothing moved for too long."""
        self._stalled = None
        now, pending = self.loop.time(), self.transport.get_write_buffer_size()
        since, before = self._sending_mark
        if pending < before:  # the client read some
            self._sending_mark = (now, pending)
        elif now - since >= self.limits.send_seconds:
            log.info(
                "the client read nothing of its answer for %gs: connection closed",
                self.limits.send_seconds,
            )
            self.transport.abort()  # the answer's send returns; it sees the client gone
            return
        self._stalled = self.loop.call_later(self._send_check_seconds(), self._check_sending)


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedProtocol]:
    """The protocol class to give uvicorn (``Config(http=...)``) for these limits."""
    return type(
        "GuardedProtocol", (GuardedProtocol,), {"limits": limits, "serials": itertools.count()}
    )


def fit_open_files(max_connections: int) -> int:
    """Raise the soft open-file limit so ``max_connections`` fit beside :data:`FD_RESERVE`,
    as far as the hard limit allows; how many connections fit (at least 64)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + FD_RESERVE
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return max_connections
    raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    except (ValueError, OSError) as exc:  # a sandbox that refuses
        log.debug("could not raise the open-file limit: %s", exc)
        raised = soft
    return max_connections if raised >= wanted else max(_MIN_CONNECTIONS, raised - FD_RESERVE)
