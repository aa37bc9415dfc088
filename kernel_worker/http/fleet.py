"""A fleet behind a load balancer: the polls and cancels this worker cannot answer go to its
peers (``--peers``).

Behind a round-robin proxy, the poll of a job answered ``202`` by one worker may reach any
other. A job id names its worker (``<worker-id>.<random>``, see :mod:`kernel_worker.jobs`).
A worker that gets a poll for a job of another asks its peers, all at once, with the
client's own ``Authorization`` and a hop header that stops a peer from forwarding again.
The one that holds the job answers ``200`` (its state, its failure as data, or the bundle),
the others ``404``; that answer goes back unchanged, a bundle streamed as it comes. Which
peer answered for a worker id is remembered, so later polls of that worker's jobs ask it
alone first. A cancel for a build that runs nowhere here is sent to every peer and the
answers OR-ed (the client's own cancel waits 5 s, so the peers get 3).

Peers are only the configured ones (see :mod:`.peers`): base URLs, and ``dns:NAME:PORT``
entries re-resolved every :data:`REFRESH_SECONDS` (a Kubernetes headless Service lists
every pod). No address is ever taken from a request, and an id goes to a peer only as one
plain path segment (never ``.`` or ``..``, which would name another route there).

What forwarding may hold is bounded (:class:`PeerLimits`): requests in flight per peer and
sockets to all peers together (within the open files
:data:`~kernel_worker.http.connections.FD_RESERVE` keeps beside the worker's own
connections), a short connect timeout and a bound on how long a peer may take to start its
answer. A peer that let a request time out is marked hanging for a few seconds, and requests
to it fail at once meanwhile. Forwarded requests carry no cookies, and a ``502`` tells the
client how many peers could not be asked, never which: the log says which, under the error
id the answer gives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from urllib.parse import quote

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..cancellation import cancel_and_wait
from ..errors import NotFound, UpstreamFailed
from ..logs import request_id
from .peers import (
    REFRESH_SECONDS,
    FreeingStream,
    NoCookies,
    Peer,
    PeerLimits,
    Peers,
    PeerUnavailable,
    plain_segment,
)

__all__ = ["HOP_HEADER", "REFRESH_SECONDS", "Fleet", "ForwardObserver", "PeerLimits", "Peers"]

log = logging.getLogger(__name__)

HOP_HEADER = "X-Strata-Worker-Forwarded"
"""Marks a request one worker forwarded to another (its value: the sender's id); a worker
never forwards such a request again."""
ForwardObserver = Callable[[str, str, float], None]
"""Told of each request sent on to the peers: ``poll`` or ``cancel``, how it ended (see
:data:`kernel_worker.metrics.FORWARD_OUTCOMES`) and its seconds."""
CANCEL_SECONDS = 3.0
"""How long a forwarded cancel waits for the peers (Strata's client gives its cancel 5 s)."""
# the client's headers a forwarded request carries (the token is checked by each peer)
_PASSED_ON = ("authorization", "accept", "accept-encoding", "user-agent")
# headers of a peer's answer that belong to that connection, or that this worker sets itself
_NOT_PASSED_BACK = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "date", "server", "x-request-id"}
)


class Fleet:
    """This worker's id and peers, and the client that forwards to them."""

    def __init__(
        self, worker_id: str, peers: Iterable[str], limits: PeerLimits | None = None
    ) -> None:
        self.worker_id = worker_id
        self.peers = Peers(peers)
        self.limits = limits or PeerLimits()
        self._client: httpx.AsyncClient | None = None
        self._homes: dict[str, str] = {}
        """A worker id -> the peer URL that last answered a poll for one of its jobs."""
        self._peers: dict[str, Peer] = {}
        self.observe: ForwardObserver = _unobserved
        """Told of every poll and cancel sent on (the app's metrics count them)."""

    def open(self) -> None:
        """Make the client (on the event loop, once the worker serves); none without peers."""
        if self.peers and self._client is None:
            limits = self.limits
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(
                    limits.read_seconds,
                    connect=limits.connect_seconds,
                    pool=limits.connect_seconds,
                ),
                # idle connections go before a peer's own 5 s keep-alive closes them, so a
                # request is never sent on a connection the peer is closing
                limits=httpx.Limits(
                    max_connections=limits.total_connections,
                    max_keepalive_connections=min(32, limits.total_connections),
                    keepalive_expiry=4.0,
                ),
                cookies=NoCookies(),
                trust_env=False,  # peers are reached directly, never through HTTP_PROXY
                follow_redirects=False,
            )

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def forwards(self, request: Request) -> bool:
        """Whether ``request`` may go to the peers: there are some, and it came from none."""
        return self._client is not None and HOP_HEADER not in request.headers

    async def forward_poll(self, request: Request, job_id: str) -> Response:
        """:meth:`poll`, observed: ``found``, ``not_found`` or ``peers_failed``."""
        started, outcome = time.monotonic(), "interrupted"
        try:
            answer = await self.poll(request, job_id)
            outcome = "found"
            return answer
        except NotFound:
            outcome = "not_found"
            raise
        except UpstreamFailed:
            outcome = "peers_failed"
            raise
        finally:
            self.observe("poll", outcome, time.monotonic() - started)

    async def forward_cancel(self, request: Request, build_id: str) -> bool:
        """:meth:`cancel`, observed: ``cancelled`` or ``not_running``."""
        started, outcome = time.monotonic(), "interrupted"
        try:
            cancelled = await self.cancel(request, build_id)
            outcome = "cancelled" if cancelled else "not_running"
            return cancelled
        finally:
            self.observe("cancel", outcome, time.monotonic() - started)

    async def poll(self, request: Request, job_id: str) -> Response:
        """The answer of the peer that holds ``job_id``, passed back as it comes.

        Raises:
            ValueError: ``job_id`` is not a plain path segment (the route refuses those).
            NotFound: No peer holds it.
            UpstreamFailed: None holds it, but some could not be asked (down, hanging, or
                an answer other than 200 or 404): the job may be on one of those.
        """
        path = "/v1/jobs/" + _segment(job_id)
        headers = self._headers(request)
        urls = await self.peers.urls()
        owner, dot, _ = job_id.partition(".")
        home = self._homes.get(owner) if dot else None
        failures: list[str] = []
        if home in urls:  # the peer that answered for this worker's jobs before
            found, failures = await self._first_ok([home], path, headers)
            if found is not None:
                return _PassedBack(found[1])
            urls = [url for url in urls if url != home]
        found, more = await self._first_ok(urls, path, headers)
        failures += more
        if found is not None:
            if dot:
                self._homes[owner] = found[0]
            return _PassedBack(found[1])
        if failures:
            error_id = secrets.token_hex(6)
            log.warning(
                "poll of job %s: no peer holds it; not asked: %s (error %s)",
                job_id, ", ".join(failures), error_id,
            )  # fmt: skip
            raise UpstreamFailed(
                f"Unknown job here; {len(failures)} of the workers that may hold it could "
                f"not be asked (error {error_id})"
            )
        raise NotFound("Unknown or expired job")

    async def cancel(self, request: Request, build_id: str) -> bool:
        """Ask every peer to cancel ``build_id``; True if one was running it.

        Raises:
            ValueError: ``build_id`` is not a plain path segment (the route refuses those).
        """
        path = f"/v1/executions/{_segment(build_id)}/cancel"
        headers = self._headers(request)
        urls = await self.peers.urls()
        asks = [asyncio.ensure_future(self._cancel_at(url, path, headers)) for url in urls]
        try:
            if asks:
                await asyncio.wait(asks, timeout=CANCEL_SECONDS)
        finally:  # also when this cancel is cancelled: nothing it sent goes on without it
            await cancel_and_wait(*asks)
        return any(
            not task.cancelled() and task.exception() is None and task.result() for task in asks
        )

    async def _cancel_at(self, url: str, path: str, headers: dict[str, str]) -> bool:
        try:
            response = await self._ask("POST", url, path, headers)
            try:
                await response.aread()
            finally:
                await response.aclose()
            return response.status_code == 200 and response.json().get("cancelled") is True
        except (httpx.HTTPError, PeerUnavailable, ValueError, AttributeError) as exc:
            log.warning("cancel forwarded to %s failed: %s", url, _why(exc))
            return False

    def _headers(self, request: Request) -> dict[str, str]:
        headers = {name: request.headers[name] for name in _PASSED_ON if name in request.headers}
        headers.setdefault("accept-encoding", "identity")  # the bytes pass back as they are
        headers[HOP_HEADER] = self.worker_id
        headers["x-request-id"] = request_id.get()  # one id in every worker's log
        return headers

    def _peer(self, url: str) -> Peer:
        peer = self._peers.get(url)
        if peer is None:
            if len(self._peers) >= 1024:  # dns: peers come and go; forget the idle ones
                for gone in [u for u, p in self._peers.items() if not p.in_flight]:
                    del self._peers[gone]
            peer = self._peers[url] = Peer(self.limits)
        return peer

    async def _ask(
        self, method: str, url: str, path: str, headers: dict[str, str]
    ) -> httpx.Response:
        """Send a request to one peer within :attr:`limits`; its answer, still open (its
        slot is free again once the answer is closed).

        Raises:
            PeerUnavailable: The peer is marked hanging, or no slot for it freed in time.
            httpx.HTTPError: The request failed (a timeout marks the peer hanging).
        """
        client = self._client
        assert client is not None
        peer = self._peer(url)
        await peer.take()
        request = client.build_request(method, url + path, headers=headers)
        try:
            async with asyncio.timeout(self.limits.answer_seconds):
                response = await client.send(request, stream=True)
        except httpx.PoolTimeout:  # all sockets to peers in use: this peer is not to blame
            peer.free()
            raise
        except (TimeoutError, httpx.TimeoutException) as exc:
            peer.hangs()
            peer.free()
            if isinstance(exc, TimeoutError):
                raise httpx.ReadTimeout("no answer in time", request=request) from None
            raise
        except BaseException:
            peer.free()
            raise
        response.stream = FreeingStream(response.stream, peer)
        return response

    async def _first_ok(
        self, urls: list[str], path: str, headers: dict[str, str]
    ) -> tuple[tuple[str, httpx.Response] | None, list[str]]:
        """GET ``path`` from every URL at once: the first that answers ``200`` with its
        answer, still open (its body not read), and why those that could not answer did
        not (a ``404`` is no failure)."""
        asks = {asyncio.ensure_future(self._ask("GET", url, path, headers)): url for url in urls}
        found: tuple[str, httpx.Response] | None = None
        failures: list[str] = []
        pending = set(asks)
        try:
            while pending and found is None:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for ask in done:
                    try:
                        response = ask.result()
                    except (httpx.HTTPError, PeerUnavailable) as exc:
                        failures.append(f"{asks[ask]} ({_why(exc)})")
                        continue
                    if response.status_code == 200 and found is None:
                        found = asks[ask], response
                        continue
                    if response.status_code != 404:
                        failures.append(f"{asks[ask]} ({response.status_code})")
                    await response.aclose()
        except BaseException:
            if found is not None:
                await found[1].aclose()
            raise
        finally:
            await cancel_and_wait(*pending)
            for ask in pending:  # an answer that came as it was cancelled: not used
                if not ask.cancelled() and ask.exception() is None:
                    await ask.result().aclose()
        return found, failures


def _unobserved(request: str, outcome: str, seconds: float) -> None:
    """No one counts forwarded requests (a fleet made without the app's metrics)."""


def _segment(value: str) -> str:
    """``value`` as one percent-quoted path segment (see :func:`plain_segment`)."""
    if not plain_segment(value):
        raise ValueError("An id sent to a peer must be a single plain path segment")
    return quote(value, safe="")


def _why(exc: BaseException) -> str:
    """Why a peer was not asked, for the log (no text of the exception's own)."""
    return str(exc) if isinstance(exc, PeerUnavailable) else type(exc).__name__


class _PassedBack(StreamingResponse):
    """A peer's open answer as this worker's own: status, headers and bytes unchanged. The
    answer is closed (its slot freed) however this one ends: sent, cut short, or not sent."""

    def __init__(self, answer: httpx.Response) -> None:
        headers = {k: v for k, v in answer.headers.items() if k.lower() not in _NOT_PASSED_BACK}
        super().__init__(answer.aiter_raw(), status_code=answer.status_code, headers=headers)
        self._answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:  # also when the client went away mid-way
            with contextlib.suppress(Exception):
                await self._answer.aclose()
