"""A fleet behind a real load balancer: three workers, HAProxy round-robin in front.

HAProxy (Debian's package, installed by ``.ci/run``) runs ``deploy/haproxy.cfg`` with its
addresses and check timing replaced, and rotates every request over the workers, so a
poll of a ``202`` job seldom reaches the worker that holds it: that worker forwards it to
its peers (``--peers``). The tests drive the fleet as Strata's client does: ``httpx``,
``job_url`` resolved against the submit URL, polled every second with the same headers.
Each cell returns a value of its own, so every answer is checked to be its request's.
Without HAProxy the proxy tests skip; forwarding between the workers is still tested.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from kernel_worker.http.fleet import HOP_HEADER, Peers
from kernel_worker.jobs import Execution, Job, JobQueue, JobResult
from kernel_worker.runs.directory import RunDir
from kernel_worker.settings import default_worker_id, memory_backed, parse_peers, parse_worker_id
from tests.conftest import ROOT, SHM, WorkerProcess, free_port, stop_process
from tests.wire import read_bundle, v1_metadata

TOKEN = "fleet-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NOTICE = 2.0
"""--drain-notice: well over the test proxy's check (out within 500 + 250 ms, fall 2)."""


def _program(name: str) -> str | None:
    """``name`` on PATH, or in /usr/sbin (Debian's packages put daemons there)."""
    found = shutil.which(name) or f"/usr/sbin/{name}"
    return found if os.access(found, os.X_OK) else None


HAPROXY = _program("haproxy")
NGINX = _program("nginx")
needs_haproxy = pytest.mark.skipif(
    HAPROXY is None, reason="haproxy is not installed (apt-get install haproxy; .ci/run does)"
)
_values = itertools.count(1000)


class Member(WorkerProcess):
    """A worker of the fleet on a port of its own, which a restart keeps."""

    def __init__(self, index: int, port: int, peers: str, run_dir: Path, log_file: Path) -> None:
        self.worker_id = f"w{index}"
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.run_dir = run_dir
        self._owns_run_dir = False
        self.log_file = log_file
        self.kernel_pids: set[int] = set()
        self._args = [
            "--host", "127.0.0.1", "--port", str(port), "--run-dir", str(run_dir),
            "--log-level", "warning", "--worker-id", self.worker_id, "--peers", peers,
            "--pool-size", "1", "--queue-wait", "0.2", "--drain-notice", str(NOTICE),
            "--drain-seconds", "30",
        ]  # fmt: skip
        self.start()

    def start(self) -> None:
        env = {**os.environ, "STRATA_WORKER_TOKEN": TOKEN}
        env.pop("PYTEST_CURRENT_TEST", None)
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kernel_worker", *self._args],
                env=env, cwd=ROOT, stdout=log, stderr=log,
            )  # fmt: skip


@dataclass
class Fleet:
    members: list[Member]
    tmp: Path
    proxy_url: str | None = None
    haproxy: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)

    def tails(self) -> str:
        """The end of every log (for a failure's message)."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.logs
        )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    ports = [free_port() for _ in range(3)]
    peers = ",".join(f"http://127.0.0.1:{port}" for port in ports)  # itself included
    if memory_backed(SHM) and os.access(SHM, os.W_OK):
        runs = Path(tempfile.mkdtemp(prefix="skw-fleet-", dir=SHM))
    else:
        runs = tmp / "runs"
        runs.mkdir()
    members: list[Member] = []
    fleet = Fleet(members, tmp)
    try:
        for index, port in enumerate(ports):
            run_dir = runs / f"w{index}"
            run_dir.mkdir()
            log = tmp / f"w{index}.log"
            fleet.logs.append(log)
            members.append(Member(index, port, peers, run_dir, log))
        for member in members:
            try:
                member.wait_ready()
            except (RuntimeError, TimeoutError) as exc:
                raise AssertionError(f"{member.worker_id}: {exc}\n{fleet.tails()}") from None
        yield fleet
    finally:
        if fleet.haproxy is not None:
            stop_process(fleet.haproxy, 5)
        for member in members:  # all at once: each has its --drain-notice to sit out
            if member.proc.poll() is None:
                member.proc.terminate()
        for member in members:
            member.stop()
        shutil.rmtree(runs, ignore_errors=True)


@pytest.fixture(scope="module")
def proxy(fleet: Fleet) -> str:
    """HAProxy on a free port in front of the fleet, running ``deploy/haproxy.cfg``."""
    assert HAPROXY is not None  # (the tests that use it are marked needs_haproxy)
    if fleet.proxy_url is not None:
        return fleet.proxy_url
    port = free_port()
    config = fleet.tmp / "haproxy.cfg"
    config.write_text(test_config(port, fleet.members))
    log = fleet.tmp / "haproxy.log"
    fleet.logs.append(log)
    with open(log, "wb") as out:
        fleet.haproxy = subprocess.Popen(
            [HAPROXY, "-db", "-f", str(config)], stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:  # every server up: three /ready in a row through the proxy
        assert fleet.haproxy.poll() is None, fleet.tails()
        try:
            if all(httpx.get(url + "/ready", timeout=2).status_code == 200 for _ in range(3)):
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, fleet.tails()
        time.sleep(0.1)
    fleet.proxy_url = url
    return url


def test_config(port: int, members: list[Member]) -> str:
    """``deploy/haproxy.cfg`` on loopback, with checks fast enough for a test, naming the
    worker that answered each request (``X-Served-By``)."""
    text = (ROOT / "deploy" / "haproxy.cfg").read_text()
    text, binds = re.subn(r"(?m)^    bind :9000$", f"    bind 127.0.0.1:{port}", text)
    text, checks = re.subn(
        r"(?m)^    default-server .*$",
        "    default-server check inter 500ms fastinter 250ms downinter 200ms fall 2 rise 2\n"
        "    http-response set-header X-Served-By %[srv_name]",
        text,
    )
    servers = "".join(f"    server {m.worker_id} 127.0.0.1:{m.port}\n" for m in members)
    text, count = re.subn(r"(?m)^    server .*\n", "", text)
    assert (binds, checks, count) == (1, 1, 3), "deploy/haproxy.cfg changed shape"
    return text.rstrip("\n") + "\n" + servers


test_config.__test__ = False  # type: ignore[attr-defined]  # (a helper, not a test)


@needs_haproxy
def test_the_shipped_haproxy_config_is_valid() -> None:
    assert HAPROXY is not None
    check = subprocess.run(
        [HAPROXY, "-c", "-f", str(ROOT / "deploy" / "haproxy.cfg")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx-light)")
def test_the_shipped_nginx_config_is_valid(tmp_path: Path) -> None:
    """``deploy/nginx.conf`` inside an ``http`` block, as conf.d files are."""
    assert NGINX is not None
    main = tmp_path / "nginx.conf"
    main.write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{}}\n"
        f"http {{\n  access_log off;\n  client_body_temp_path {tmp_path}/body;\n"
        f"  proxy_temp_path {tmp_path}/proxy;\n  include {ROOT}/deploy/nginx.conf;\n}}\n"
    )
    check = subprocess.run([NGINX, "-t", "-p", str(tmp_path), "-c", str(main)],
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stderr


# --- the client, as Strata's ---------------------------------------------------------


@dataclass
class Answer:
    value: int
    status: int
    content_type: str
    body: bytes
    job_id: str | None = None
    polls: list[str] = field(default_factory=list)
    """Which worker the proxy sent each poll to (``X-Served-By``)."""
    submitted_to: str | None = None
    """The worker the proxy sent the cell to."""
    sent_at: float = 0.0
    answered_at: float = 0.0
    """When the submit was answered (200, or 202)."""

    def returned(self) -> object:
        response = httpx.Response(self.status, content=self.body)
        return read_bundle(response).variables["value"]["preview"]


def _cell(value: int, seconds: float) -> list[tuple[str, tuple[str, bytes, str]]]:
    meta = v1_metadata(f"import time\ntime.sleep({seconds})\nvalue = {value}")
    return [("metadata", ("metadata.json", json.dumps(meta).encode(), "application/json"))]


async def run_cell(client: httpx.AsyncClient, base: str, seconds: float = 0.5) -> Answer:
    """One cell with a value of its own, as Strata's client sends it (202: poll each second)."""
    value = next(_values)
    submit = base + "/v1/execute"
    sent_at = time.monotonic()
    response = await client.post(submit, files=_cell(value, seconds), headers=AUTH)
    answer = Answer(value, response.status_code, response.headers.get("content-type", ""), b"")
    answer.submitted_to = response.headers.get("x-served-by")
    answer.sent_at, answer.answered_at = sent_at, time.monotonic()
    if response.status_code == 202:
        job_url = urljoin(submit, response.json()["job_url"])
        assert urlsplit(job_url)[:2] == urlsplit(submit)[:2], job_url  # same scheme and host
        answer.job_id = job_url.rsplit("/", 1)[1]
        while True:
            await asyncio.sleep(1.0)
            response = await client.get(job_url, headers=AUTH)
            answer.polls.append(response.headers.get("x-served-by", "?"))
            kind = response.headers.get("content-type", "")
            if response.status_code != 200 or kind == "application/x-tar":
                break
            assert response.json()["state"] in ("queued", "running"), response.text
    answer.status = response.status_code
    answer.content_type = response.headers.get("content-type", "")
    answer.body = response.content
    return answer


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=httpx.Timeout(60.0))


def check_answers(answers: list[Answer], fleet: Fleet) -> None:
    """Each request answered once, with a bundle that holds its own value."""
    failed = [(a.value, a.status, a.body[:200]) for a in answers if a.status != 200]
    assert not failed, f"{failed}\n{fleet.tails()}"
    assert all(a.returned() == a.value for a in answers)
    counts = Counter(a.value for a in answers)
    assert max(counts.values()) == 1


# --- settings ------------------------------------------------------------------------


def test_peer_and_worker_id_settings() -> None:
    assert parse_peers(" http://10.0.0.2:9000/ ,dns:workers.ns.svc:9000,") == (
        "http://10.0.0.2:9000", "dns:workers.ns.svc:9000",
    )  # fmt: skip
    for bad in ("10.0.0.2:9000", "ftp://x", "dns:x", "dns:x:70000", "http://u:p@x", "http://x/?a"):
        with pytest.raises(ValueError):
            parse_peers(bad)
    assert parse_worker_id(" gpu-3 ") == "gpu-3"
    for bad in ("", "a.b", "a_b", "x" * 64):
        with pytest.raises(ValueError):
            parse_worker_id(bad)
    default = default_worker_id(9000)
    assert default.endswith("-9000") and parse_worker_id(default) == default


def test_dns_peers_resolve_to_each_address() -> None:
    async def urls() -> list[str]:
        return await Peers(["http://10.0.0.9:9000", "dns:localhost:9123"]).urls()

    found = asyncio.run(urls())
    assert found[0] == "http://10.0.0.9:9000"
    assert "http://127.0.0.1:9123" in found[1:] or "http://[::1]:9123" in found[1:]


# --- between workers, no proxy -------------------------------------------------------


def test_any_worker_answers_a_poll_for_a_job_of_another(fleet: Fleet) -> None:
    """A job queued on w0 is polled through w1 and w2 (forwarded), collected once."""
    w0, w1, w2 = fleet.members

    async def scenario() -> tuple[Answer, list[int], httpx.Response]:
        async with _client() as client:
            busy = asyncio.ensure_future(run_cell(client, w0.url, seconds=1.5))
            await _until_busy(client, w0)  # w0's one kernel is taken: the next cell queues
            cell = _cell(4242, 0.1)
            queued = await client.post(w0.url + "/v1/execute", files=cell, headers=AUTH)
            assert queued.status_code == 202, queued.text
            job_url = queued.json()["job_url"]
            assert job_url.startswith("/v1/jobs/w0.")
            unauthorized = await client.get(w1.url + job_url)  # the token is checked first
            states = [unauthorized.status_code]
            hop = await client.get(w1.url + job_url, headers={**AUTH, HOP_HEADER: "w2"})
            states.append(hop.status_code)  # a forwarded poll is never forwarded again
            for member in itertools.cycle((w1, w2)):
                poll = await client.get(member.url + job_url, headers=AUTH)
                if poll.headers["content-type"] == "application/x-tar":
                    break
                assert poll.json()["state"] in ("queued", "running"), poll.text
                await asyncio.sleep(0.3)
            again = await client.get(w2.url + job_url, headers=AUTH)
            assert again.status_code == 404, again.text  # delivered once
            own = await client.get(w0.url + "/v1/jobs/w0.gone", headers=AUTH)
            assert own.status_code == 404  # its own id: not asked around
            assert (await busy).status == 200
            return Answer(4242, poll.status_code, "", poll.content), states, poll

    answer, states, poll = asyncio.run(scenario())
    assert states == [401, 404]
    assert answer.returned() == 4242
    assert poll.headers["x-strata-executor-protocol"] == "v1"  # the holder's headers


def test_a_cancel_reaches_the_worker_that_runs_the_build(fleet: Fleet) -> None:
    w0, w1, _ = fleet.members
    meta = v1_metadata(_PRINTS_THEN_SLEEPS) | {"build_id": "fleet-direct"}
    files = [("metadata", ("metadata.json", json.dumps(meta).encode(), "application/json"))]

    async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with _client() as client:
            running = asyncio.ensure_future(
                client.post(w0.url + "/v1/execute", files=files, headers=AUTH)
            )
            await _until_running(client, [w0], "fleet-direct")
            nothing = await client.post(w1.url + "/v1/executions/nobody/cancel", headers=AUTH)
            cancel = await client.post(w1.url + "/v1/executions/fleet-direct/cancel", headers=AUTH)
            return nothing, cancel, await running

    started = time.monotonic()
    nothing, cancel, running = asyncio.run(scenario())
    assert nothing.json() == {"build_id": "nobody", "cancelled": False}
    assert cancel.json() == {"build_id": "fleet-direct", "cancelled": True}
    assert running.status_code == 409, running.text
    assert time.monotonic() - started < 20


async def _until_busy(client: httpx.AsyncClient, member: Member) -> None:
    deadline = time.monotonic() + 15
    while (await client.get(member.url + "/health")).json()["pool"]["kernels"].get("busy", 0) < 1:
        assert time.monotonic() < deadline, "the cell never started"
        await asyncio.sleep(0.05)


_PRINTS_THEN_SLEEPS = "print('running', flush=True)\nimport time\ntime.sleep(30)"


async def _until_running(client: httpx.AsyncClient, members: list[Member], build_id: str) -> None:
    """Wait until one of ``members`` runs ``build_id``'s cell, which has printed its first
    line (asked of each worker directly: a console poll is never forwarded)."""
    deadline = time.monotonic() + 15
    while True:
        for member in members:
            url = f"{member.url}/v1/executions/{build_id}/console"
            console = await client.get(url, headers=AUTH)
            if console.status_code == 200 and "running" in console.json()["stdout"]["text"]:
                return
        assert time.monotonic() < deadline, "the cell never started"
        await asyncio.sleep(0.05)


async def _until_queued_on_each(client: httpx.AsyncClient, members: list[Member]) -> None:
    """Wait until each of ``members`` has been seen with a job queued (a 202 to poll)."""
    deadline = time.monotonic() + 30
    seen: set[str] = set()
    while len(seen) < len(members):
        for member in members:
            if (await client.get(member.url + "/health")).json()["queue_depth"] > 0:
                seen.add(member.url)
        assert time.monotonic() < deadline, f"no job queued on some worker, only on {seen}"
        await asyncio.sleep(0.05)


# --- through HAProxy -----------------------------------------------------------------


@needs_haproxy
def test_every_queued_job_is_collected_through_the_proxy(fleet: Fleet, proxy: str) -> None:
    """12 clients, 3 kernels: most cells queue (202), and their polls rotate over workers."""

    async def client_loop() -> list[Answer]:
        async with _client() as client:
            return [await run_cell(client, proxy) for _ in range(3)]

    async def load() -> list[Answer]:
        results = await asyncio.gather(*(client_loop() for _ in range(12)))
        return [answer for answers in results for answer in answers]

    answers = asyncio.run(load())
    check_answers(answers, fleet)
    queued = [a for a in answers if a.job_id is not None]
    assert len(queued) >= 12, "the load did not make cells queue"
    elsewhere = [a for a in queued if a.polls[-1] != (a.job_id or "").partition(".")[0]]
    assert elsewhere, "no result was collected through a worker that did not hold it"


@needs_haproxy
def test_a_cancel_through_the_proxy_reaches_the_running_cell(fleet: Fleet, proxy: str) -> None:
    meta = v1_metadata(_PRINTS_THEN_SLEEPS) | {"build_id": "fleet-proxied"}
    files = [("metadata", ("metadata.json", json.dumps(meta).encode(), "application/json"))]

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with _client() as client:
            running = asyncio.ensure_future(
                client.post(proxy + "/v1/execute", files=files, headers=AUTH)
            )
            # asked of each worker directly: the proxy's rotation stays as it is
            await _until_running(client, fleet.members, "fleet-proxied")
            # round robin: the proxy sends this to the worker after the one running the cell
            cancel = await client.post(proxy + "/v1/executions/fleet-proxied/cancel", headers=AUTH)
            return cancel, await running

    cancel, running = asyncio.run(scenario())
    assert cancel.json() == {"build_id": "fleet-proxied", "cancelled": True}, fleet.tails()
    assert running.status_code == 409, running.text
    assert cancel.headers["x-served-by"] != running.headers["x-served-by"]


@needs_haproxy
def test_rolling_restart_loses_no_request(fleet: Fleet, proxy: str) -> None:
    """SIGTERM one worker under load, start it again: every request answered once, right."""
    w1 = fleet.members[1]
    stop = asyncio.Event()
    answers: list[Answer] = []
    events: dict[str, object] = {}

    async def client_loop() -> None:
        async with _client() as client:
            while not stop.is_set():
                answers.append(await run_cell(client, proxy, seconds=0.4))

    async def restart() -> None:
        async with _client() as client:
            await _until_queued_on_each(client, fleet.members)  # the load is on
            signalled = events["signalled"] = time.monotonic()
            w1.proc.send_signal(signal.SIGTERM)
            # the notice: /ready is 503 at once, yet a cell sent to it directly still runs
            deadline = time.monotonic() + 5
            while (await client.get(w1.url + "/ready")).status_code != 503:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            direct = await run_cell(client, w1.url, seconds=0)  # polled there if queued
            events["direct"] = (direct.status, direct.answered_at - signalled)
            events["exit"] = await asyncio.to_thread(w1.proc.wait, 60)
            events["stopped_after"] = time.monotonic() - signalled
            w1.start()
            await asyncio.to_thread(w1.wait_ready)
            back = time.monotonic()
            deadline = back + 20
            # the restarted worker serves cells again, a few of them before the load stops
            while sum(a.submitted_to == w1.worker_id and a.sent_at > back for a in answers) < 3:
                assert time.monotonic() < deadline, "the restarted worker got no cells"
                await asyncio.sleep(0.05)
        stop.set()

    async def scenario() -> None:
        await asyncio.gather(restart(), *(client_loop() for _ in range(12)))

    asyncio.run(scenario())
    assert events["exit"] == 0, fleet.tails()
    status, answered_after = events["direct"]  # type: ignore[misc]
    assert status == 200 and answered_after < NOTICE, events
    check_answers(answers, fleet)
    assert len(answers) >= 24
    assert any(a.job_id and a.job_id.startswith("w1.") for a in answers)
    signalled = events["signalled"]
    assert isinstance(signalled, float)
    # the proxy still sent it cells after the signal, before its check saw /ready: taken
    late = [a for a in answers if a.submitted_to == "w1" and signalled < a.sent_at]
    assert late, "no cell reached the stopping worker through the proxy: nothing was tested"


async def test_a_drain_waits_for_the_first_poll_of_a_202_job(tmp_path: Path) -> None:
    """A job answered 202 that ends before its client's first poll (up to a second later)
    is waited for: a drain that ended then would stop the worker with the result unread."""

    async def runner(job: Job) -> JobResult:
        return b"bundle"

    queue = JobQueue(max_queued=4, ttl_seconds=600, worker_id="w9")
    job = queue.submit(Execution("build"), RunDir.make(tmp_path), runner)
    assert job.job_id.startswith("w9.") and queue.is_own(job.job_id)
    assert not queue.is_own("w1." + job.job_id[3:]) and not queue.is_own("w9")
    queue.hand_off(job)
    await job.done.wait()
    assert queue.uncollected == 1
    assert queue.claim(job) and queue.uncollected == 0
    await queue.aclose()
