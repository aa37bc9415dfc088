"""The security page's promises, each attacked through a real worker on loopback.

Every test here tries what ``docs/security.md`` (or the security statements of the other
pages) says cannot be done, and asserts that it fails. Where the test's process may read
another process's memory (root, or the same user with ptrace rights) it also looks there,
which is what a cell with those rights would do; elsewhere that part is skipped.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.conftest import ROOT, WorkerProcess, free_port, start_worker, stop_process, wait_gone
from tests.wire import execute, read_bundle, run_ok
from tests.worker.test_manifest_headers import RawServer

# -- helpers -----------------------------------------------------------------------------------


def _readable_mappings(pid: int) -> Iterator[tuple[int, int]]:
    """The (start, end) of each private, writable mapping of ``pid``: the heap, the stacks,
    anonymous memory and data sections, where a value a process received would be."""
    with open(f"/proc/{pid}/maps", encoding="ascii") as maps:
        for line in maps:
            fields = line.split()
            if not fields[1].startswith("rw"):
                continue
            if len(fields) > 5 and fields[5].startswith("[v"):  # [vvar], [vsyscall]
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            yield start, end


def memory_holding(pid: int, needles: Iterable[bytes]) -> set[bytes]:
    """Which of ``needles`` appear in ``pid``'s writable memory (PermissionError when this
    process may not read it)."""
    needles = set(needles)
    found: set[bytes] = set()
    overlap = max(len(n) for n in needles)
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for start, end in _readable_mappings(pid):
            tail = b""
            for at in range(start, end, 16 << 20):
                try:
                    mem.seek(at)
                    chunk = tail + mem.read(min(16 << 20, end - at))
                except OSError:
                    break
                found |= {n for n in needles if n in chunk}
                tail = chunk[-overlap:]
    return found


def can_read_memory_of(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            start, _ = next(_readable_mappings(pid))
            mem.seek(start)
            mem.read(1)
    except (OSError, StopIteration):
        return False
    return True


def fork_server_of(worker: WorkerProcess) -> psutil.Process:
    (server,) = [
        p
        for p in psutil.Process(worker.proc.pid).children()
        if any(part.endswith("_zygote.py") for part in p.cmdline())
    ]
    return server


def kernel_processes(worker: WorkerProcess) -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process(worker.proc.pid).children()
        if "ipykernel_launcher" in " ".join(p.cmdline())
    ]


# -- the worker's secrets never reach a kernel ----------------------------------------------------

_MARK = uuid.uuid4().hex[:10]
CREDENTIAL_NAME = f"corp-{_MARK}"
ACCESS_KEY = f"AKIA-{_MARK}-access-key"
SECRETS = {
    "STRATA_WORKER_TOKEN": f"worker-token-{_MARK}",
    "STRATA_WORKER_CONNECT_TOKEN": f"connect-token-{_MARK}",
    "STRATA_NOTEBOOK_CREDENTIALS": json.dumps(
        {CREDENTIAL_NAME: {"key": ACCESS_KEY, "secret": f"secret-key-{_MARK}"}}
    ),
    "STRATA_NOTEBOOK_MOUNT_CREDENTIALS": json.dumps({"s3": CREDENTIAL_NAME}),
    "STRATA_PROXY_TOKEN": f"proxy-token-{_MARK}",
    "STRATA_NOTEBOOK_REMOTE_STORE_HEADERS": json.dumps({"Authorization": f"Bearer rs-{_MARK}"}),
}
# every value, and the credential's key on its own (what a worker that parsed it holds)
NEEDLES = {value.encode() for value in SECRETS.values()} | {ACCESS_KEY.encode()}
AUTH = {"Authorization": f"Bearer {SECRETS['STRATA_WORKER_TOKEN']}"}

# what a cell would try: its environment, a child's, every process's initial environment
# block it can open (the worker's, the fork server's, the other kernels')
_LOOK_FOR_SECRETS = """
import os, subprocess, sys
names = {names!r}
in_environ = sorted(n for n in names if n in os.environ)
child = subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.environ))'],
                       capture_output=True, text=True).stdout
in_child = sorted(n for n in names if n in child)
blocks = {{}}
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            blocks[pid] = open(f'/proc/{{pid}}/environ', 'rb').read().hex()
        except OSError:
            pass
"""


@pytest.fixture(scope="module", params=["fork", "spawn-with-allowlist"])
def secretive(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A worker holding all six secrets. The spawned one's allowlist names ``STRATA_*``,
    which must not let them through (a prefix never matches a ``STRATA_*`` name)."""
    env = dict(SECRETS)
    args = ["--pool-size", "2"]
    if request.param == "fork":
        args += ["--kernel-start", "fork"]
    else:
        args += ["--kernel-start", "spawn"]
        env["STRATA_NOTEBOOK_HARNESS_ENV_ALLOWLIST"] = "STRATA_*,MPLBACKEND,CREDS_*"
        env["CREDS_API_KEY"] = "listed-by-prefix"  # a listed prefix is the operator's choice
        env["PYTHON_API_KEY"] = f"floor-credential-{_MARK}"  # floor prefix, credential name
        env["UV_INDEX_URL"] = f"https://me:pw-{_MARK}@index.example/simple"  # a uv login
        env["UV_INDEX_CORP_PASSWORD"] = f"uv-password-{_MARK}"
    w = start_worker(tmp_path_factory, *args, env=env)
    w.start_mode = request.param  # type: ignore[attr-defined]
    yield w
    w.stop()


def test_no_secret_reaches_a_kernel_nor_any_environment_block_a_cell_can_open(
    secretive: WorkerProcess,
) -> None:
    with httpx.Client(base_url=secretive.url, timeout=60, headers=AUTH) as c:
        bundle = run_ok(c, _LOOK_FOR_SECRETS.format(names=sorted(SECRETS)))
    v = bundle.variables
    assert v["in_environ"]["preview"] == [] and v["in_child"]["preview"] == []
    blocks = {int(pid): bytes.fromhex(b) for pid, b in json.loads(bundle.file("blocks")).items()}
    assert secretive.proc.pid in blocks  # the worker's block is readable (same user) ...
    for pid, block in blocks.items():  # ... and, like every other one, holds no secret
        leaked = sorted(n.decode() for n in NEEDLES if n in block)
        assert leaked == [], f"/proc/{pid}/environ shows {leaked}"


def test_the_allowlist_floor_lets_no_credential_through(secretive: WorkerProcess) -> None:
    if secretive.start_mode == "fork":  # type: ignore[attr-defined]
        pytest.skip("the allowlist is set on the spawned worker")
    names = ["CREDS_API_KEY", "PYTHON_API_KEY", "UV_INDEX_URL", "UV_INDEX_CORP_PASSWORD"]
    with httpx.Client(base_url=secretive.url, timeout=60, headers=AUTH) as c:
        bundle = run_ok(c, f"import os\nseen = {{n: os.environ.get(n) for n in {names!r}}}")
    assert json.loads(bundle.file("seen")) == {
        "CREDS_API_KEY": "listed-by-prefix",
        "PYTHON_API_KEY": None,
        "UV_INDEX_URL": None,
        "UV_INDEX_CORP_PASSWORD": None,
    }


def test_no_secret_is_in_a_kernels_or_the_fork_servers_memory(secretive: WorkerProcess) -> None:
    """``nothing else is in a kernel's memory``: read as root (or with ptrace rights) would."""
    with httpx.Client(base_url=secretive.url, timeout=60, headers=AUTH) as c:
        run_ok(c, "x = 1")  # a request has been served: the kernels have seen one
    targets = kernel_processes(secretive)
    assert len(targets) == 2
    if secretive.start_mode == "fork":  # type: ignore[attr-defined]
        targets.append(fork_server_of(secretive))
    if not can_read_memory_of(targets[0].pid):
        pytest.skip("this process may not read another process's memory")
    # the scan finds a secret where one is: the worker holds its token to check it
    token = SECRETS["STRATA_WORKER_TOKEN"].encode()
    assert memory_holding(secretive.proc.pid, [token]) == {token}
    for process in targets:
        leaked = sorted(n.decode() for n in memory_holding(process.pid, NEEDLES))
        assert leaked == [], f"{process.cmdline()[:3]} (pid {process.pid}) holds {leaked}"


# -- a forked kernel's key -----------------------------------------------------------------------

_KEY_AND_FOLDER = (
    "import os\n"
    "key = get_ipython().kernel.session.key.decode()\n"
    "folder = os.path.dirname(os.environ['IPYTHONDIR'])\n"
    "pid = os.getpid()\n"
)


def test_a_forked_kernels_key_is_on_no_disk_command_line_or_fork_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    w = start_worker(tmp_path_factory, "--pool-size", "2", "--kernel-start", "fork")
    try:
        with httpx.Client(base_url=w.url, timeout=60) as c:
            bundle = run_ok(c, _KEY_AND_FOLDER)
        key = bundle.variables["key"]["preview"].encode()
        pool_dir = Path(bundle.variables["folder"]["preview"]).parent
        assert len(key) >= 16
        # not in any file of the pool's folder (sockets and temp folders included) ...
        for dirpath, _, filenames in os.walk(pool_dir):
            for name in filenames:
                path = os.path.join(dirpath, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    assert key not in Path(path).read_bytes(), path
        # ... nor on any process's command line ...
        for process in psutil.process_iter(["cmdline"]):
            assert key.decode() not in " ".join(process.info["cmdline"] or []), process
        # ... nor in the memory of the fork server that later kernels are forked from
        server = fork_server_of(w)
        if not can_read_memory_of(server.pid):
            pytest.skip("this process may not read another process's memory")
        kernel = bundle.variables["pid"]["preview"]
        assert memory_holding(kernel, [key]) == {key}  # the scan finds it where it is
        assert memory_holding(server.pid, [key]) == set()
    finally:
        w.stop()


# -- without a token the worker binds loopback only ------------------------------------------------


def _other_local_address() -> str | None:
    """An address of this machine that is not loopback (a cell's way in from outside)."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return str(address.address)
    return None


def test_without_a_token_the_worker_listens_on_loopback_only(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "STRATA_WORKER_TOKEN"}
    env.pop("STRATA_KERNEL_WORKER_HOST", None)
    env.pop("PYTEST_CURRENT_TEST", None)
    runs = tmp_path_factory.mktemp("runs")
    command = [sys.executable, "-m", "kernel_worker", "--port", str(port), "--pool-size", "1",
               "--run-dir", str(runs), "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(command, env=env, cwd=ROOT)
    kernels: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"the worker exited with {proc.returncode}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the worker never became ready"
            time.sleep(0.1)
        kernels = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        listening = [
            c.laddr
            for c in psutil.Process(proc.pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
        other = _other_local_address()
        if other is not None:  # reached from another interface: nothing listens there
            with pytest.raises(OSError), socket.create_connection((other, port), timeout=2):
                pass
    finally:
        stop_process(proc, 30)
        wait_gone(kernels, 10, "a kernel outlived its worker")


# -- no input or request field becomes kernel source ----------------------------------------------


def _injections(marker: str) -> dict[str, dict[str, Any]]:
    """Requests that would create ``marker`` if any field were pasted into kernel source."""
    code = f"open({marker!r}, 'w').write('ran')"
    quoted = f"x'); {code} #"
    return {
        "an input's name": {"inputs": [
            ({"name": f"x=1;{code}#", "format": "json/object"}, b"1")]},
        "an input's value": {"inputs": [
            ({"name": "x", "format": "json/object"}, json.dumps(quoted).encode())]},
        "a text input": {"inputs": [
            ({"name": "x", "format": "text/markdown"}, f'"""\n{code}\n"""'.encode())]},
        "a module/import name": {"inputs": [
            ({"name": "x", "format": "module/import"},
             json.dumps({"module_name": f"os;{code}"}).encode())]},
        "an env name and value": {"env": {f"A');{code}#": quoted}},
        "a table's name and uri": {"tables": {f"t=1;{code}#": {"uri": quoted, "snapshot_id": 1}}},
        "a mutation define": {"mutation_defines": [f"x;{code}"]},
        "an output folder's name": {"source": f"# @output_dir d');{code}#\nx = 1"},
        "a build id": {"build_id": quoted},
    }  # fmt: skip


@pytest.mark.parametrize("field", sorted(_injections("m")))
def test_no_request_field_is_made_into_kernel_source(
    worker: WorkerProcess, tmp_path: Path, field: str
) -> None:
    marker = str(tmp_path / "ran")
    request = _injections(marker)[field]
    source = request.pop("source", "y = 1")
    inputs = request.pop("inputs", None)
    with httpx.Client(base_url=worker.url, timeout=60) as c:
        response = execute(c, source, inputs, **request)
    assert response.status_code < 500, response.text
    assert not os.path.exists(marker), f"{field} ran as code"


# -- an input runs in the kernel, never in the worker ------------------------------------------------


class _RecordsWhereItRuns:
    """Unpickling it runs ``exec`` of code that writes the pid of the process doing it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        code = f"open({self.path!r}, 'a').write(str(__import__('os').getpid()) + '\\n')"
        return (exec, (code,))


def test_an_input_that_runs_code_runs_it_in_the_kernel_not_the_worker(
    worker: WorkerProcess, tmp_path: Path
) -> None:
    record = str(tmp_path / "pids")
    module = (
        f"import os\nopen({record!r}, 'a').write(str(os.getpid()) + '\\n')\n"
        "def recorder():\n    return 1\n"
    )
    descriptor = {
        "module_name": f"nb_recorder_{uuid.uuid4().hex[:12]}",
        "symbol_name": "recorder",
        "kind": "function",
        "source": module,
        "provenance_hash": "abc",
    }
    inputs = [
        ({"name": "obj", "format": "pickle/object"}, pickle.dumps(_RecordsWhereItRuns(record))),
        ({"name": "recorder", "format": "module/cell", "file": "recorder.cell_module.json"},
         json.dumps(descriptor).encode()),
    ]  # fmt: skip
    with httpx.Client(base_url=worker.url, timeout=60) as c:
        bundle = read_bundle(execute(c, "import os\nkernel = os.getpid()", inputs))
    pids = {int(line) for line in Path(record).read_text().split()}
    assert worker.proc.pid not in pids
    assert bundle.manifest["success"], bundle.manifest
    assert len(Path(record).read_text().split()) == 2  # the pickle's code and the module's
    assert pids == {bundle.variables["kernel"]["preview"]}


# -- --recycle fresh: a hostile cell reaches no later request ----------------------------------------

_HOSTILE = (
    "import builtins, sys, os\n"
    "sys.planted_by_an_earlier_request = 'seen'\n"  # data attached to sys lives on a kernel
    "builtins.print = lambda *a, **k: None\n"
    "exec('get_ipython().events.register(\"pre_run_cell\", lambda *a: None)')\n"
    "pid = os.getpid()\n"
)
_VICTIM = (
    "import sys, os, builtins\n"
    "planted = getattr(sys, 'planted_by_an_earlier_request', None)\n"
    "hooks = len(get_ipython().events.callbacks['pre_run_cell'])\n"
    "print_is_builtin = type(builtins.print).__name__ == 'builtin_function_or_method'\n"
    "pid = os.getpid()\n"
)


def test_with_recycle_fresh_no_request_sees_what_an_earlier_cell_planted(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--recycle", "fresh")
    try:
        with httpx.Client(base_url=w.url, timeout=60) as c:
            baseline = run_ok(c, _VICTIM).variables
            attacker = run_ok(c, _HOSTILE).variables
            victim = run_ok(c, _VICTIM).variables
    finally:
        w.stop()
    assert len({baseline["pid"]["preview"], attacker["pid"]["preview"],
                victim["pid"]["preview"]}) == 3  # fmt: skip
    assert victim["planted"]["preview"] is None
    assert victim["hooks"]["preview"] == baseline["hooks"]["preview"]
    assert victim["print_is_builtin"]["preview"] is True


# -- cell source and values are never logged, at any level --------------------------------------------


def test_no_cell_source_or_value_is_logged_even_at_debug(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    mark = uuid.uuid4().hex[:8]
    token = f"log-token-{mark}"
    w = start_worker(
        tmp_path_factory, "--pool-size", "1", "--log-level", "debug", "--log-format", "json",
        env={"STRATA_WORKER_TOKEN": token}, capture_logs=True,
    )  # fmt: skip
    source = (
        f"source_marker = 'src-{mark}'\n"
        "import os\nfrom IPython.display import HTML, display\n"
        f"display(HTML('<b>display-{mark}</b>'))\n"
        f"result = 'output-' + '{mark}'[::-1]\n"
        "echo = os.environ['SECRET_ENV'] + value\n"
        f"os.system('echo fd-' + 'out-{mark}')\n"
        f"raise ValueError('message-{mark}')\n"
    )
    inputs = [({"name": "value", "format": "json/object"}, json.dumps(f"input-{mark}").encode())]
    try:
        with httpx.Client(base_url=w.url, timeout=60,
                          headers={"Authorization": f"Bearer {token}"}) as c:  # fmt: skip
            bundle = read_bundle(execute(c, source, inputs, env={"SECRET_ENV": f"env-{mark}"}))
            assert bundle.manifest["success"] is False
            assert f"out-{mark}" in bundle.stdout()  # what the cell's processes print
            run_ok(c, "x = 1")  # everything of the first request has been passed on
    finally:
        w.stop()
    logs = w.logs()
    assert "the cell raised ValueError" in logs  # debug logging was on and was read
    for needle in (mark, mark[::-1], token):
        assert needle not in logs, logs[max(0, logs.find(needle) - 500) :][:1500]


# -- a manifest's forbidden header stops the run before anything is fetched or run -------------------


@pytest.fixture(scope="module")
def local_puller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    w = start_worker(tmp_path_factory, "--pool-size", "1",
                     env={"STRATA_WORKER_ALLOW_LOCAL_HOSTS": "1"})  # fmt: skip
    yield w
    w.stop()


@pytest.fixture
def raw() -> Iterator[RawServer]:
    server = RawServer()
    yield server
    server.close()


@pytest.mark.parametrize(
    "headers",
    [{"HoSt": "metadata.internal"}, {"pRoXy-Authorization": "Basic x"},
     {"x-a": "b\u0000c"}, {"x-a": "b\rc"}],
)  # fmt: skip
def test_a_refused_output_header_fetches_no_input_and_runs_no_cell(
    local_puller: WorkerProcess, raw: RawServer, tmp_path: Path, headers: dict[str, str]
) -> None:
    marker = tmp_path / "ran"
    key = uuid.uuid4().hex[:8]
    source = f"open({str(marker)!r}, 'w').write('ran')\nx = value"
    body = {
        "build_id": key,
        "metadata": {"executor_ref": "notebook_cell@v1", "build_id": key,
                     "params": {"source": source, "timeout_seconds": 60, "input_specs": {
                         "value": {"uri": f"strata://artifact/a-{key}@v=1",
                                   "content_type": "json/object"}}}},
        "inputs": [{"url": f"{raw.url}/blob/a-{key}", "artifact_id": f"a-{key}", "version": 1,
                    "expires_at": 2e9}],
        "output": {"url": f"{raw.url}/upload/{key}", "method": "PUT", "headers": headers},
        "finalize_url": f"{raw.url}/finalize/{key}",
        "log_url": f"{raw.url}/log/{key}",
    }  # fmt: skip
    with httpx.Client(base_url=local_puller.url, timeout=60) as c:
        response = c.post("/v1/execute-manifest", json=body)
    assert response.status_code == 400, response.text
    name = next(iter(headers))
    assert repr(name) in response.json()["detail"]
    assert raw.arrived == []  # no input fetched, nothing uploaded or finalized
    assert not marker.exists()  # and the cell never ran


# -- --connect binds no port --------------------------------------------------------------------


def test_with_connect_the_worker_listens_on_no_port(tmp_path: Path) -> None:
    from tests.fake_relay import FakeRelay

    relay = FakeRelay(token="relay-token")
    env = {**os.environ, "STRATA_WORKER_CONNECT_TOKEN": "relay-token"}
    env.pop("PYTEST_CURRENT_TEST", None)
    (tmp_path / "runs").mkdir()
    # given a --port too: --connect must still bind none
    worker = WorkerProcess(["--connect", relay.url, "--pool-size", "1"], env, tmp_path / "runs")
    try:
        relay.wait_connected(1)
        deadline = time.monotonic() + 60
        with relay.client(timeout=10) as client:
            while client.get("/ready").status_code != 200:
                assert time.monotonic() < deadline, "no warm kernel behind the relay"
                time.sleep(0.1)
        worker.remember_kernels()
        # the worker's own sockets (each kernel has ipykernel's loopback pipe for the output
        # of forked subprocesses, which is not the worker's to bind or not)
        listening = [
            c.laddr
            for c in psutil.Process(worker.proc.pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert listening == []
        with pytest.raises(httpx.ConnectError):
            httpx.get(worker.url + "/health", timeout=5)
    finally:
        worker.stop()
        relay.close()
