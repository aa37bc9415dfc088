"""The pull model's URL rules, and connections pinned to the addresses that were checked."""

from __future__ import annotations

import socket
from collections.abc import Iterable, Iterator, Sequence

import httpcore
import httpx
import pytest

from kernel_worker.errors import BadRequest
from kernel_worker.pull.url_safety import (
    PinnedBackend,
    UrlGuard,
    UrlPolicy,
    address_problem,
    guarded_client,
    pinned,
    system_resolver,
)
from tests.fake_store import FakeStore

SCHEMES = "only ['http', 'https'] are accepted."


class Resolver:
    """A resolver answering from a table, counting its lookups; then maybe changing its mind."""

    def __init__(self, answers: dict[str, Sequence[str]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    async def __call__(self, host: str) -> Sequence[str]:
        self.calls.append(host)
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.answers[host]


async def refusal(
    url: str, policy: UrlPolicy | None = None, resolver: Resolver | None = None
) -> str:
    guard = UrlGuard(policy or UrlPolicy(), resolver or Resolver({}))
    with pytest.raises(BadRequest) as info:
        await guard.check(url, "Manifest output.url")
    return info.value.detail


# -- scheme and host ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "scheme"),
    [("ftp://h/x", "ftp"), ("file:///etc/passwd", "file"), ("javascript:alert(1)", "javascript"),
     ("data:text/plain,hi", "data"), ("gopher://h/", "gopher"), ("no-scheme/path", ""),
     ("HTTPX://h/", "httpx")],
)  # fmt: skip
async def test_only_http_and_https(url: str, scheme: str) -> None:
    expected = f"Manifest output.url URL uses disallowed scheme {scheme!r}; {SCHEMES}"
    assert await refusal(url) == expected
    assert await refusal(url, UrlPolicy(allow_local=True)) == expected  # never bypassed


@pytest.mark.parametrize("url", ["http:///path", "https://:443/x", "http://"])
async def test_a_host_is_required_even_with_allow_local(url: str) -> None:
    expected = f"Manifest output.url URL is missing a host: {url!r}"
    assert await refusal(url) == expected
    assert await refusal(url, UrlPolicy(allow_local=True)) == expected


async def test_an_unparsable_url_is_refused() -> None:
    assert (
        await refusal("http://[::1/x")
        == "Manifest output.url URL is not a valid URL: 'http://[::1/x'"
    )


async def test_a_host_that_does_not_resolve() -> None:
    detail = await refusal("https://nowhere.invalid/x")
    assert detail.startswith("Manifest output.url URL host 'nowhere.invalid' did not resolve: ")


# -- addresses ------------------------------------------------------------------------------------

REFUSED = [
    ("127.0.0.1", "127.0.0.1"), ("127.8.9.10", "127.8.9.10"), ("10.1.2.3", "10.1.2.3"),
    ("172.16.0.1", "172.16.0.1"), ("192.168.1.1", "192.168.1.1"),
    ("169.254.169.254", "169.254.169.254"), ("100.64.0.1", "100.64.0.1"),
    ("100.127.255.254", "100.127.255.254"), ("224.0.0.1", "224.0.0.1"), ("0.0.0.0", "0.0.0.0"),
    ("240.0.0.1", "240.0.0.1"), ("255.255.255.255", "255.255.255.255"),
    ("192.0.2.1", "192.0.2.1"), ("198.18.0.1", "198.18.0.1"),
    ("::1", "::1"), ("::", "::"), ("fe80::1", "fe80::1"), ("fe80::1%eth0", "fe80::1%eth0"),
    ("fd00:ec2::254", "fd00:ec2::254"), ("fc00::1", "fc00::1"), ("ff02::1", "ff02::1"),
    ("2001:db8::1", "2001:db8::1"),
    ("::ffff:127.0.0.1", "127.0.0.1"), ("::ffff:169.254.169.254", "169.254.169.254"),
    ("::ffff:10.0.0.1", "10.0.0.1"), ("64:ff9b::a9fe:a9fe", "169.254.169.254"),
    ("2002:a00:1::1", "10.0.0.1"),
]  # fmt: skip
PUBLIC = ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8",
          "64:ff9b::808:808"]  # fmt: skip


@pytest.mark.parametrize(("address", "reported"), REFUSED)
async def test_non_routable_addresses_are_refused(address: str, reported: str) -> None:
    resolver = Resolver({"store.example": [address]})
    assert await refusal("https://store.example/b", resolver=resolver) == (
        f"Manifest output.url URL host 'store.example' resolves to non-routable address "
        f"{reported}; refusing to fetch"
    )


@pytest.mark.parametrize("address", PUBLIC)
async def test_public_addresses_pass_and_are_pinned(address: str) -> None:
    guard = UrlGuard(UrlPolicy(), Resolver({"store.example": [address]}))
    await guard.check("https://store.example/b?sig=1", "Manifest output.url")
    assert guard.pins == {"store.example": (address,)}


async def test_every_address_must_pass() -> None:
    resolver = Resolver({"store.example": ["8.8.8.8", "10.0.0.7", "1.1.1.1"]})
    detail = await refusal("https://store.example/b", resolver=resolver)
    assert detail.endswith("resolves to non-routable address 10.0.0.7; refusing to fetch")


async def test_a_resolver_answering_a_non_ip_is_refused() -> None:
    resolver = Resolver({"store.example": ["not-an-ip"]})
    assert await refusal("https://store.example/b", resolver=resolver) == (
        "Manifest output.url URL host 'store.example' resolved to non-IP address 'not-an-ip'"
    )


def test_address_problem_is_none_for_public_lists() -> None:
    assert address_problem("h", PUBLIC) is None


@pytest.mark.parametrize(
    "url",
    ["http://2130706433/", "http://0x7f.1/", "http://017700000001/", "http://127.1/",
     "http://0x7f000001/", "http://localhost/", "http://[::ffff:127.0.0.1]/"],
)  # fmt: skip
async def test_numeric_spellings_are_checked_as_what_they_resolve_to(url: str) -> None:
    guard = UrlGuard(UrlPolicy(), system_resolver)
    with pytest.raises(BadRequest) as info:
        await guard.check(url, "Manifest log_url")
    assert "resolves to non-routable address" in info.value.detail
    assert info.value.detail.startswith("Manifest log_url URL host ")


async def test_one_lookup_per_host_per_guard() -> None:
    resolver = Resolver({"store.example": ["8.8.8.8"], "api.example": ["1.1.1.1"]})
    guard = UrlGuard(UrlPolicy(), resolver)
    for url in ["https://store.example/a", "https://STORE.example/b", "https://api.example/c"]:
        await guard.check(url, "Manifest input[a@v=1]")
    assert resolver.calls == ["store.example", "api.example"]
    assert guard.pins == {"store.example": ("8.8.8.8",), "api.example": ("1.1.1.1",)}


async def test_idna_hosts_are_resolved_and_pinned_as_the_transport_sees_them() -> None:
    resolver = Resolver({"xn--bcher-kva.example": ["8.8.4.4"]})
    guard = UrlGuard(UrlPolicy(), resolver)
    await guard.check("https://Bücher.example/x", "Manifest output.url")
    assert guard.pins == {"xn--bcher-kva.example": ("8.8.4.4",)}


# -- exemptions -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allowed", "host"),
    [(("store.internal",), "store.internal"), (("store.internal",), "STORE.internal."),
     ((".corp.example",), "build.corp.example"), ((".corp.example",), "a.b.corp.example"),
     ((".corp.example",), "corp.example")],
)  # fmt: skip
async def test_allowed_hosts_pass_without_being_resolved(
    allowed: tuple[str, ...], host: str
) -> None:
    resolver = Resolver({})
    guard = UrlGuard(UrlPolicy(allowed_hosts=allowed), resolver)
    await guard.check(f"https://{host}/x", "Manifest finalize_url")
    assert resolver.calls == [] and guard.pins == {}


@pytest.mark.parametrize("host", ["evil-corp.example", "corp.example.evil", "xstore.internal"])
async def test_allowed_hosts_are_not_loose_matches(host: str) -> None:
    policy = UrlPolicy(allowed_hosts=("store.internal", ".corp.example"))
    detail = await refusal(f"https://{host}/x", policy, Resolver({host: ["10.0.0.1"]}))
    assert detail.endswith("resolves to non-routable address 10.0.0.1; refusing to fetch")


async def test_allow_local_bypasses_the_address_rule() -> None:
    resolver = Resolver({})
    guard = UrlGuard(UrlPolicy(allow_local=True), resolver)
    await guard.check("http://127.0.0.1:9/x", "Manifest output.url")
    await guard.check("http://169.254.169.254/latest", "Manifest output.url")
    assert resolver.calls == [] and guard.pins == {}


def test_policy_from_environment() -> None:
    from kernel_worker.cli import settings_from

    env = {
        "STRATA_WORKER_ALLOW_LOCAL_HOSTS": " Yes ",
        "STRATA_WORKER_ALLOWED_HOSTS": "A.example, .Corp ,",
    }
    settings = settings_from([], env)
    assert settings.allow_local_hosts is True
    assert settings.allowed_hosts == ("a.example", ".corp")
    assert settings_from([], {"STRATA_WORKER_ALLOW_LOCAL_HOSTS": "0"}).allow_local_hosts is False


# -- the pinned transport -------------------------------------------------------------------------


class LoopbackBackend(httpcore.AsyncNetworkBackend):
    """Records where the pinned backend asked to connect, then connects to loopback."""

    def __init__(self) -> None:
        self.targets: list[tuple[str, int]] = []
        self._real = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        self.targets.append((host, port))
        return await self._real.connect_tcp(
            "127.0.0.1", port, timeout, local_address, socket_options
        )

    async def sleep(self, seconds: float) -> None:
        await self._real.sleep(seconds)


@pytest.fixture(scope="module")
def store() -> Iterator[FakeStore]:
    fake = FakeStore()
    fake.start()
    fake.blobs["blob"] = b"pinned!"
    yield fake
    fake.stop()


def port_of(store: FakeStore) -> int:
    return httpx.URL(store.url).port or 80


async def test_connections_use_the_checked_address_not_a_later_answer(store: FakeStore) -> None:
    port = port_of(store)
    url = f"http://rebind.example:{port}/blob/blob"
    resolver = Resolver({"rebind.example": ["93.184.216.34"]})
    guard = UrlGuard(UrlPolicy(), resolver)
    await guard.check(url, "Manifest input[blob@v=1]")
    resolver.answers["rebind.example"] = ["127.0.0.1"]  # the name is rebound after the check
    loopback = LoopbackBackend()
    async with guarded_client(UrlPolicy(), resolver=resolver, inner=loopback) as client:
        with pinned(guard.pins):
            response = await client.get(url)
    assert response.status_code == 200 and response.content == b"pinned!"
    assert loopback.targets == [("93.184.216.34", port)]  # the checked address, no 2nd lookup
    assert resolver.calls == ["rebind.example"]
    assert store.hosts[-1] == f"rebind.example:{port}"  # the Host header keeps the name


async def test_an_unpinned_host_is_resolved_and_checked_at_connect_time(store: FakeStore) -> None:
    port = port_of(store)
    resolver = Resolver({"rebind.example": ["127.0.0.1"]})
    loopback = LoopbackBackend()
    async with guarded_client(UrlPolicy(), resolver=resolver, inner=loopback) as client:
        with pytest.raises(httpx.ConnectError, match=r"non-routable address 127\.0\.0\.1"):
            await client.get(f"http://rebind.example:{port}/blob/blob")
        with pytest.raises(httpx.ConnectError, match=r"non-routable address 127\.0\.0\.1"):
            await client.get(f"http://127.0.0.1:{port}/blob/blob")
        resolver.answers["public.example"] = ["8.8.8.8"]
        response = await client.get(f"http://public.example:{port}/blob/blob")
    assert response.status_code == 200
    assert loopback.targets == [("8.8.8.8", port)]


async def test_pins_apply_only_inside_their_context(store: FakeStore) -> None:
    port = port_of(store)
    resolver = Resolver({"rebind.example": ["127.0.0.1"]})
    async with guarded_client(UrlPolicy(), resolver=resolver, inner=LoopbackBackend()) as client:
        with pinned({"rebind.example": ("8.8.8.8",)}):
            assert (await client.get(f"http://rebind.example:{port}/blob/blob")).status_code == 200
        # a new client: no pooled connection to reuse
    async with guarded_client(UrlPolicy(), resolver=resolver, inner=LoopbackBackend()) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://rebind.example:{port}/blob/blob")


async def test_exempt_hosts_connect_by_name(store: FakeStore) -> None:
    resolver = Resolver({})
    async with guarded_client(UrlPolicy(allow_local=True), resolver=resolver) as client:
        response = await client.get(f"{store.url}/blob/blob")
    assert response.content == b"pinned!" and resolver.calls == []


async def test_redirects_are_not_followed(store: FakeStore) -> None:
    async with guarded_client(UrlPolicy(allow_local=True)) as client:
        response = await client.get(f"{store.url}/redirect/blob")
    assert response.status_code == 302 and response.next_request is not None


async def test_proxy_variables_cannot_route_around_the_pin(
    store: FakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://10.9.9.9:3128")
    port = port_of(store)
    loopback = LoopbackBackend()
    resolver = Resolver({"store.example": ["8.8.8.8"]})
    async with guarded_client(UrlPolicy(), resolver=resolver, inner=loopback) as client:
        response = await client.get(f"http://store.example:{port}/blob/blob")
    assert response.status_code == 200
    assert loopback.targets == [("8.8.8.8", port)]


async def test_addresses_are_tried_in_order(store: FakeStore) -> None:
    port = port_of(store)

    class FirstFails(LoopbackBackend):
        async def connect_tcp(
            self, host: str, port: int, *args: object, **kwargs: object
        ) -> httpcore.AsyncNetworkStream:
            if host == "8.8.8.8":
                self.targets.append((host, port))
                raise httpcore.ConnectError("unreachable")
            return await super().connect_tcp(host, port)

    backend = FirstFails()
    async with guarded_client(UrlPolicy(), inner=backend) as client:
        with pinned({"two.example": ("8.8.8.8", "1.1.1.1")}):
            response = await client.get(f"http://two.example:{port}/blob/blob")
    assert response.status_code == 200
    assert backend.targets == [("8.8.8.8", port), ("1.1.1.1", port)]


def test_backend_is_an_httpcore_backend() -> None:
    assert isinstance(PinnedBackend(UrlPolicy()), httpcore.AsyncNetworkBackend)
