"""Which URLs the pull model may reach, and connecting only where the check said.

A manifest hands the worker URLs to GET and POST; whoever writes the manifest could aim
them at the worker's own network (cloud metadata, a database on a private address). The
rules (spec §10):

1. the scheme is ``http`` or ``https``, and there is a host;
2. ``allow_local`` (``STRATA_WORKER_ALLOW_LOCAL_HOSTS``) skips the address rule;
   a host named in ``allowed_hosts`` (``STRATA_WORKER_ALLOWED_HOSTS``: exact names or
   ``.suffix``) skips it without being resolved;
3. otherwise the host is resolved once and **every** address must be globally routable.
   IPv4 carried inside IPv6 (mapped ``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4
   ``2002::/16``) is checked as the IPv4 it reaches.

Beyond the reference, the connection goes to an address that was checked, with no second
lookup in between (no DNS-rebinding window): :class:`UrlGuard` records the addresses it
checked, :func:`pinned` makes them the current request's pins, and :class:`PinnedBackend`
(the network backend of :func:`guarded_client`'s transport) opens TCP only to a pinned
address, or, for a host not pinned, to an address it resolved and checked itself. TLS SNI,
certificate checks and the ``Host`` header still use the name. The client ignores proxy
variables (a proxy would resolve the name itself) and never follows redirects.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType
from urllib.parse import urlsplit

import httpcore
import httpx

from ..errors import BadRequest

__all__ = [
    "ALLOWED_SCHEMES",
    "PinnedBackend",
    "PinnedTransport",
    "Resolver",
    "UrlGuard",
    "UrlPolicy",
    "address_problem",
    "guarded_client",
    "pinned",
    "system_resolver",
]

log = logging.getLogger(__name__)

ALLOWED_SCHEMES = ("http", "https")
Resolver = Callable[[str], Awaitable[Sequence[str]]]
"""Every address a host name resolves to (raises ``OSError`` when it does not resolve)."""

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NO_PINS: Mapping[str, tuple[str, ...]] = MappingProxyType({})
_pins: ContextVar[Mapping[str, tuple[str, ...]]] = ContextVar("skw_pins", default=_NO_PINS)


async def system_resolver(host: str) -> list[str]:
    """``getaddrinfo`` (in the loop's executor): the one lookup a check makes."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def _lookup(resolver: Resolver, host: str) -> tuple[str, ...]:
    """An IP literal as itself; any other name (``2130706433`` too) through *resolver*."""
    try:
        return (str(ipaddress.ip_address(host)),)
    except ValueError:
        return tuple(await resolver(host))


@dataclass(frozen=True, slots=True)
class UrlPolicy:
    """The worker's exemptions from the address rule."""

    allow_local: bool = False
    allowed_hosts: tuple[str, ...] = ()

    def exempts(self, host: str) -> bool:
        """Whether *host* skips the address rule (by name, never by address).

        A suffix entry is anchored on its dot: ``.example.com`` matches
        ``build.example.com`` and ``example.com``, never ``evil-example.com``.
        Names compare in their ASCII (IDNA) form, as connections see them.
        """
        if self.allow_local:
            return True
        name = host.lower().rstrip(".")
        for entry in self.allowed_hosts:
            if entry.startswith(".") and (name.endswith(entry) or name == entry[1:]):
                return True
            if name == entry:
                return True
        return False


def address_problem(host: str, addresses: Iterable[str]) -> str | None:
    """Why connecting to *host* at *addresses* is refused, or None when every one is public."""
    for address in addresses:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return f"host {host!r} resolved to non-IP address {address!r}"
        for reached in _reached(ip):
            if not _routable(reached):
                return (
                    f"host {host!r} resolves to non-routable address {reached}; refusing to fetch"
                )
    return None


def _reached(ip: IPAddress) -> list[IPAddress]:
    """The addresses a connection to *ip* reaches, all of which must be routable.

    A mapped or NAT64 address reaches the IPv4 address it carries (and only that); a 6to4
    address is judged both as itself and as the IPv4 address it carries.
    """
    if isinstance(ip, ipaddress.IPv4Address):
        return [ip]
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip in _NAT64:
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip.sixtofour is not None:
        return [ip.sixtofour, ip]
    return [ip]


# IANA special-purpose IPv4 that older interpreters' ipaddress tables call global
_NOT_GLOBAL = (ipaddress.ip_network("192.0.0.0/24"),)


def _routable(ip: IPAddress) -> bool:
    flags = (ip.is_loopback, ip.is_link_local, ip.is_private, ip.is_multicast, ip.is_reserved)
    if ip.version == 4 and any(ip in network for network in _NOT_GLOBAL):
        return False
    # is_global also catches what the flags miss, e.g. 100.64.0.0/10 (carrier-grade NAT).
    return not any(flags) and not ip.is_unspecified and ip.is_global


class UrlGuard:
    """Checks one request's URLs and remembers the addresses it passed (its pins).

    Each host is resolved at most once per guard, so a manifest naming one store for
    every input costs one lookup.
    """

    def __init__(self, policy: UrlPolicy, resolver: Resolver = system_resolver) -> None:
        self._policy = policy
        self._resolver = resolver
        self._pins: dict[str, tuple[str, ...]] = {}

    @property
    def pins(self) -> Mapping[str, tuple[str, ...]]:
        """Host (as the transport sees it: lowercase, IDNA-encoded) → checked addresses."""
        return MappingProxyType(dict(self._pins))

    async def check(self, url: str, label: str) -> None:
        """Refuse *url* with the reference's detail, naming *label* (e.g. ``Manifest log_url``).

        Raises:
            BadRequest: Wrong scheme, no host, a host that does not resolve, or one that
                resolves to a non-routable address.
        """
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL:
            raise BadRequest(f"{label} URL is not a valid URL: {url!r}") from None
        if parsed.scheme not in ALLOWED_SCHEMES:
            raise BadRequest(
                f"{label} URL uses disallowed scheme {parsed.scheme!r}; "
                f"only {sorted(ALLOWED_SCHEMES)} are accepted."
            )
        if not parsed.host:
            raise BadRequest(f"{label} URL is missing a host: {url!r}")
        try:
            urlsplit(url).port  # noqa: B018  (raises for a port outside 0-65535)
        except ValueError:
            raise BadRequest(f"{label} URL is not a valid URL: {url!r}") from None
        key = parsed.raw_host.decode("ascii")  # what the backend sees (IDNA for unicode)
        if self._policy.exempts(key):
            return
        if key not in self._pins:
            self._pins[key] = await self._resolve(key, parsed.host, label)

    async def _resolve(self, key: str, host: str, label: str) -> tuple[str, ...]:
        try:
            addresses = await _lookup(self._resolver, key)
        except (OSError, UnicodeError) as exc:
            raise BadRequest(f"{label} URL host {host!r} did not resolve: {exc}") from None
        if not addresses:
            raise BadRequest(f"{label} URL host {host!r} did not resolve: no addresses")
        problem = address_problem(host, addresses)
        if problem is not None:
            raise BadRequest(f"{label} URL {problem}")
        return addresses


@contextlib.contextmanager
def pinned(pins: Mapping[str, tuple[str, ...]]) -> Iterator[None]:
    """Connections made in this context (and tasks it starts) use *pins* for their hosts."""
    token = _pins.set(MappingProxyType({**_pins.get(), **pins}))
    try:
        yield
    finally:
        _pins.reset(token)


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """Opens TCP only to a pinned address, or to one it has just resolved and checked.

    httpcore passes the URL's host here; only the TCP target changes, so TLS and the
    ``Host`` header keep the name. Addresses are tried in order, like
    ``socket.create_connection``; the last one's error is the one raised.
    """

    def __init__(
        self,
        policy: UrlPolicy,
        resolver: Resolver = system_resolver,
        inner: httpcore.AsyncNetworkBackend | None = None,
    ) -> None:
        self._policy = policy
        self._resolver = resolver
        self._inner = inner if inner is not None else httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        *earlier, last = await self._targets(host)
        for address in earlier:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                log.debug("could not connect to %s at %s: %s", host, address, exc)
        return await self._inner.connect_tcp(last, port, timeout, local_address, socket_options)

    async def _targets(self, host: str) -> tuple[str, ...]:
        pins = _pins.get().get(host)
        if pins:
            return pins
        if self._policy.exempts(host):
            return (host,)  # resolved by the socket layer, as any client would
        try:
            addresses = await _lookup(self._resolver, host)
        except (OSError, UnicodeError) as exc:
            raise httpcore.ConnectError(f"host {host!r} did not resolve: {exc}") from None
        problem = address_problem(host, addresses) if addresses else f"host {host!r} is empty"
        if problem is not None:
            raise httpcore.ConnectError(problem)
        return addresses

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def guarded_client(
    policy: UrlPolicy,
    *,
    resolver: Resolver = system_resolver,
    inner: httpcore.AsyncNetworkBackend | None = None,
) -> httpx.AsyncClient:
    """The worker's one client for outgoing transfers (close it with ``aclose``)."""
    backend = PinnedBackend(policy, resolver, inner)
    return httpx.AsyncClient(
        transport=PinnedTransport(backend),
        follow_redirects=False,
        trust_env=False,  # proxies from the environment would bypass the pinned backend
        timeout=httpx.Timeout(30.0),
    )


# httpcore's errors as httpx's, most specific first (what httpx's own transport does).
_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


@contextlib.contextmanager
def _httpx_errors(request: httpx.Request) -> Iterator[None]:
    try:
        yield
    except httpcore.ConnectError as exc:  # the common case, and the guard's refusals
        raise httpx.ConnectError(str(exc), request=request) from exc
    except tuple(cls for cls, _ in _ERRORS) as exc:
        mapped = next(to for frm, to in _ERRORS if isinstance(exc, frm))
        raise mapped(str(exc), request=request) from exc


class PinnedTransport(httpx.AsyncBaseTransport):
    """An httpx transport over an httpcore pool whose connections use *backend*.

    httpx's own transport takes no network backend, so this is the same mapping
    (request → httpcore, httpcore errors → httpx) over a pool we build ourselves.
    """

    def __init__(self, backend: httpcore.AsyncNetworkBackend) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=backend,
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _httpx_errors(request):
            response = await self._pool.handle_async_request(core_request)
        assert isinstance(response.stream, AsyncIterable)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream, request),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, stream: AsyncIterable[bytes], request: httpx.Request) -> None:
        self._stream = stream
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _httpx_errors(self._request):
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        close = getattr(self._stream, "aclose", None)
        if close is not None:
            await close()
