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

Peers are only the configured ones: base URLs, and ``dns:NAME:PORT`` entries re-resolved
every :data:`REFRESH_SECONDS` (a Kubernetes headless Service lists every pod). No address
is ever taken from a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterable
from urllib.parse import quote

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..cancellation import cancel_and_wait
from ..errors import NotFound, UpstreamFailed
from ..logs import request_id

__all__ = ["HOP_HEADER", "REFRESH_SECONDS", "Fleet", "Peers"]

log = logging.getLogger(__name__)

HOP_HEADER = "X-Strata-Worker-Forwarded"
"""Marks a request one worker forwarded to another (its value: the sender's id); a worker
never forwards such a request again."""
REFRESH_SECONDS = 5.0
"""How long the addresses a ``dns:`` peer resolved to are used before it is resolved again."""
CANCEL_SECONDS = 3.0
"""How long a forwarded cancel waits for the peers (Strata's client gives its cancel 5 s)."""
# the client's headers a forwarded request carries (the token is checked by each peer)
_PASSED_ON = ("authorization", "accept", "accept-encoding", "user-agent")
# headers of a peer's answer that belong to that connection, or that this worker sets itself
_NOT_PASSED_BACK = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "date", "server", "x-request-id"}
)


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

    def __bool__(self) -> bool:
        return bool(self._urls or self._names)

    async def urls(self) -> list[str]:
        """Every peer's base URL (each name resolved at most every ``refresh_seconds``)."""
        if self._names and time.monotonic() - self._resolved_at >= self._refresh_seconds:
            self._resolved_at = time.monotonic()  # one resolution at a time; others use the last
            await asyncio.gather(*(self._resolve(name, port) for name, port in self._names))
        urls = list(self._urls)
        for addresses in self._resolved.values():
            urls += [url for url in addresses if url not in urls]
        return urls

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


class Fleet:
    """This worker's id and peers, and the client that forwards to them."""

    def __init__(self, worker_id: str, peers: Iterable[str]) -> None:
        self.worker_id = worker_id
        self.peers = Peers(peers)
        self._client: httpx.AsyncClient | None = None
        self._homes: dict[str, str] = {}
        """A worker id -> the peer URL that last answered a poll for one of its jobs."""

    def open(self) -> None:
        """Make the client (on the event loop, once the worker serves); none without peers."""
        if self.peers and self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(30.0, connect=3.0),
                # idle connections go before a peer's own 5 s keep-alive closes them, so a
                # request is never sent on a connection the peer is closing
                limits=httpx.Limits(max_keepalive_connections=32, keepalive_expiry=4.0),
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

    async def poll(self, request: Request, job_id: str) -> Response:
        """The answer of the peer that holds ``job_id``, passed back as it comes.

        Raises:
            NotFound: No peer holds it.
            UpstreamFailed: None holds it, but some could not be asked (down, or an answer
                other than 200 or 404): the job may be on one of those.
        """
        path = "/v1/jobs/" + quote(job_id, safe="")
        headers = self._headers(request)
        urls = await self.peers.urls()
        owner, dot, _ = job_id.partition(".")
        home = self._homes.get(owner) if dot else None
        failures: list[str] = []
        if home in urls:  # the peer that answered for this worker's jobs before
            found, failures = await self._first_ok([home], path, headers)
            if found is not None:
                return _passed_back(found[1])
            urls = [url for url in urls if url != home]
        found, more = await self._first_ok(urls, path, headers)
        failures += more
        if found is not None:
            if dot:
                self._homes[owner] = found[0]
            return _passed_back(found[1])
        if failures:
            log.warning("poll of job %s: no peer holds it; not asked: %s", job_id, failures)
            raise UpstreamFailed(
                "Unknown job here; the workers that may hold it could not be asked: "
                + ", ".join(failures)
            )
        raise NotFound("Unknown or expired job")

    async def cancel(self, request: Request, build_id: str) -> bool:
        """Ask every peer to cancel ``build_id``; True if one was running it."""
        path = f"/v1/executions/{quote(build_id, safe='')}/cancel"
        headers = self._headers(request)
        urls = await self.peers.urls()
        asks = [asyncio.ensure_future(self._cancel_at(url + path, headers)) for url in urls]
        if not asks:
            return False
        done, pending = await asyncio.wait(asks, timeout=CANCEL_SECONDS)
        await cancel_and_wait(*pending)
        return any(
            not task.cancelled() and task.exception() is None and task.result() for task in done
        )

    async def _cancel_at(self, url: str, headers: dict[str, str]) -> bool:
        assert self._client is not None
        try:
            response = await self._client.post(url, headers=headers)
            return response.status_code == 200 and response.json().get("cancelled") is True
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.warning("cancel forwarded to %s failed: %s", url, type(exc).__name__)
            return False

    def _headers(self, request: Request) -> dict[str, str]:
        headers = {name: request.headers[name] for name in _PASSED_ON if name in request.headers}
        headers.setdefault("accept-encoding", "identity")  # the bytes pass back as they are
        headers[HOP_HEADER] = self.worker_id
        headers["x-request-id"] = request_id.get()  # one id in every worker's log
        return headers

    async def _first_ok(
        self, urls: list[str], path: str, headers: dict[str, str]
    ) -> tuple[tuple[str, httpx.Response] | None, list[str]]:
        """GET ``path`` from every URL at once: the first that answers ``200`` with its
        answer, still open (its body not read), and why those that could not answer did
        not (a ``404`` is no failure)."""
        client = self._client
        assert client is not None
        asks = {
            asyncio.ensure_future(
                client.send(client.build_request("GET", url + path, headers=headers), stream=True)
            ): url
            for url in urls
        }
        found: tuple[str, httpx.Response] | None = None
        failures: list[str] = []
        pending = set(asks)
        try:
            while pending and found is None:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for ask in done:
                    try:
                        response = ask.result()
                    except httpx.HTTPError as exc:
                        failures.append(f"{asks[ask]} ({type(exc).__name__})")
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


def _passed_back(answer: httpx.Response) -> Response:
    """A peer's open answer as this worker's own: status, headers and bytes unchanged."""
    headers = {k: v for k, v in answer.headers.items() if k.lower() not in _NOT_PASSED_BACK}

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in answer.aiter_raw():
                yield chunk
        finally:  # also when the client went away mid-way
            with contextlib.suppress(Exception):
                await answer.aclose()

    return StreamingResponse(body(), status_code=answer.status_code, headers=headers)
