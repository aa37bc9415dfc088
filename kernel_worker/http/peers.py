"""Who a worker's peers are (``--peers``), and what forwarding may hold of each.

:class:`Peers` resolves the configured entries: base URLs, and ``dns:NAME:PORT`` entries
re-resolved every :data:`REFRESH_SECONDS`. :class:`Peer` is what is in flight to one peer
under :class:`PeerLimits`, and whether it is known to hang; :class:`FreeingStream` frees a
request's slot when its answer is closed. :func:`plain_segment` says which ids may go into
a peer's URL, and :class:`NoCookies` is the forwarding client's jar, which keeps nothing.
"""

from __future__ import annotations

import asyncio
import http.client
import http.cookiejar
import logging
import socket
import time
import urllib.request
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import httpx

from .connections import FD_RESERVE

__all__ = [
    "REFRESH_SECONDS",
    "FreeingStream",
    "NoCookies",
    "Peer",
    "PeerLimits",
    "PeerUnavailable",
    "Peers",
    "plain_segment",
]

log = logging.getLogger(__name__)

REFRESH_SECONDS = 5.0
"""How long the addresses a ``dns:`` peer resolved to are used before it is resolved again."""


@dataclass(frozen=True, slots=True)
class PeerLimits:
    """How much of the worker forwarding to peers may hold."""

    connections_per_peer: int = 16
    """Requests in flight to one peer at once; one more waits up to ``connect_seconds`` for
    one of them to end, else that peer counts as not asked."""
    total_connections: int = FD_RESERVE // 4
    """Sockets to all peers together: part of the open files ``FD_RESERVE`` keeps beside
    the worker's own connections (a request waits for one up to ``connect_seconds``)."""
    connect_seconds: float = 2.0
    answer_seconds: float = 10.0
    """How long a peer may take to start its answer (it answers from memory; a bundle's
    bytes may then take longer, up to ``read_seconds`` between two chunks)."""
    read_seconds: float = 30.0
    hang_seconds: float = 5.0
    """After a peer let a request time out, how long requests to it fail at once."""


def plain_segment(value: str) -> bool:
    """Whether ``value``, percent-quoted, stays one path segment that means itself: not
    empty, no ``/``, not ``.`` or ``..`` (which a URL resolves away), nothing unprintable."""
    return value not in ("", ".", "..") and "/" not in value and value.isprintable()


class NoCookies(http.cookiejar.CookieJar):
    """A jar that keeps nothing: a peer's ``Set-Cookie`` never rides on a later request."""

    def set_cookie(self, cookie: http.cookiejar.Cookie) -> None:
        pass

    def extract_cookies(
        self, response: http.client.HTTPResponse, request: urllib.request.Request
    ) -> None:
        pass


class PeerUnavailable(Exception):
    """A peer not asked: marked hanging, or no slot for it freed in time."""


class Peer:
    """What is in flight to one peer, and whether it is known to hang."""

    def __init__(self, limits: PeerLimits) -> None:
        self._slots = asyncio.Semaphore(limits.connections_per_peer)
        self._limits = limits
        self.in_flight = 0
        self.hanging_until = -float("inf")

    async def take(self) -> None:
        """A slot for one request to this peer (free it with :meth:`free`).

        Raises:
            PeerUnavailable: It is marked hanging, or no slot freed in time.
        """
        if time.monotonic() < self.hanging_until:
            raise PeerUnavailable("hanging")
        try:
            async with asyncio.timeout(self._limits.connect_seconds):
                await self._slots.acquire()
        except TimeoutError:
            raise PeerUnavailable("busy") from None
        self.in_flight += 1

    def free(self) -> None:
        self.in_flight -= 1
        self._slots.release()

    def hangs(self) -> None:
        """A request to it timed out: the next ones fail at once for a while."""
        self.hanging_until = time.monotonic() + self._limits.hang_seconds


class Peers:
    """The configured peers' base URLs, with ``dns:NAME:PORT`` entries resolved."""

    def __init__(self, entries: Iterable[str], refresh_seconds: float = REFRESH_SECONDS) -> None:
        entries = tuple(entries)
        self._urls = [entry for entry in entries if not entry.startswith("dns:")]
        self._names: list[tuple[str, int]] = []
        for entry in entries:
            if entry.startswith("dns:"):
                name, _, port = entry.removeprefix("dns:").rpartition(":")
                self._names.append((name, int(port)))
        self._resolved: dict[tuple[str, int], list[str]] = {}
        self._resolved_at = -float("inf")
        self._refresh_seconds = refresh_seconds
        self._resolving = asyncio.Lock()

    def __bool__(self) -> bool:
        return bool(self._urls or self._names)

    async def urls(self) -> list[str]:
        """Every peer's base URL (each name resolved at most every ``refresh_seconds``).

        Every caller waits for the first resolution; a later one is made by one caller
        while the others use what the last one found.
        """
        if self._names and self._stale() and (self._first() or not self._resolving.locked()):
            async with self._resolving:
                if self._stale():  # (not done meanwhile by the caller this one waited for)
                    await asyncio.gather(*(self._resolve(n, port) for n, port in self._names))
                    self._resolved_at = time.monotonic()
        urls = list(self._urls)
        for addresses in self._resolved.values():
            urls += [url for url in addresses if url not in urls]
        return urls

    def _stale(self) -> bool:
        return time.monotonic() - self._resolved_at >= self._refresh_seconds

    def _first(self) -> bool:
        return self._resolved_at == -float("inf")

    async def _resolve(self, name: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except OSError as exc:  # keep what it resolved to last time
            log.warning("peers: cannot resolve %s: %s", name, exc)
            return
        urls: list[str] = []
        for family, *_, address in infos:
            host = f"[{address[0]}]" if family == socket.AF_INET6 else address[0]
            url = f"http://{host}:{port}"
            if url not in urls:
                urls.append(url)
        self._resolved[(name, port)] = urls


class FreeingStream(httpx.AsyncByteStream):
    """A peer's answer's bytes; closing them frees the request's slot, once."""

    def __init__(self, stream: httpx.SyncByteStream | httpx.AsyncByteStream, peer: Peer) -> None:
        assert isinstance(stream, httpx.AsyncByteStream)
        self._stream = stream
        self._peer: Peer | None = peer

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            peer, self._peer = self._peer, None
            if peer is not None:
                peer.free()
