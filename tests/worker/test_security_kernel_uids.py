"""``--kernel-user FIRST-LAST``, attacked where ``test_kernel_identity.py`` does not reach.

With a uid per kernel the security page promises that a cell can neither signal, trace
nor read the worker, its fork server or another kernel (kernels are non-dumpable), nor
connect to another kernel's sockets, nor read another request's run directory; that a
spawned kernel's connection file is gone once the kernel answered; and that every reset
empties the kernel's temp folder whatever modes a cell left there. Each attack below is
given the exact paths and pids a cell could only guess (the test, as root, looks them up),
so a refusal is the kernel boundary's doing, not an unlistable folder's. Needs root and an
interpreter any uid can run; elsewhere it is skipped, saying why.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import WorkerProcess, kernel_uid_unavailable, start_worker
from tests.wire import Background, read_bundle, run_ok, running_cell, wait_active, wait_running

FIRST_UID = 32000  # apart from test_kernel_identity.py's range
UIDS = f"{FIRST_UID}-{FIRST_UID + 7}"
SPAWN_UIDS = f"{FIRST_UID + 100}-{FIRST_UID + 107}"


_WHY_NOT = kernel_uid_unavailable(FIRST_UID)
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT))


def _worker_with_uids(
    tmp_path_factory: pytest.TempPathFactory, *args: str
) -> Iterator[WorkerProcess]:
    runs = tempfile.mkdtemp(prefix="skw-test-runs-")
    os.chmod(runs, 0o711)
    w = start_worker(tmp_path_factory, "--pool-size", "2", *args, run_dir=Path(runs))
    try:
        yield w
    finally:
        w.stop()
        shutil.rmtree(runs, ignore_errors=True)


@pytest.fixture(scope="module")
def apart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    yield from _worker_with_uids(tmp_path_factory, "--kernel-user", UIDS)


@pytest.fixture(scope="module")
def spawned_apart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    yield from _worker_with_uids(
        tmp_path_factory, "--kernel-user", SPAWN_UIDS, "--kernel-name", "python3"
    )


def _kernels(worker: WorkerProcess) -> dict[int, Path]:
    """Each kernel's pid and its own folder (its sockets, its temp folder)."""
    found = {}
    for p in psutil.Process(worker.proc.pid).children():
        try:
            if "ipykernel" in " ".join(p.cmdline()):
                found[p.pid] = Path(p.cwd())  # a kernel with a user of its own starts there
        except psutil.Error:  # one that just exited
            continue
    return found


def _fork_server(worker: WorkerProcess) -> int:
    (pid,) = [
        p.pid
        for p in psutil.Process(worker.proc.pid).children()
        if any(part.endswith("_zygote.py") for part in p.cmdline())
    ]
    return pid


# what a cell tries against each target process: signal it (signal 0: the permission
# check of a real signal, harmless should it pass), trace it, read its /proc files
_PROBES = """
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
def attempt(fn):
    try:
        fn()
        return 'done'
    except PermissionError:
        return 'denied'
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
def trace(pid):
    if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), 'ptrace')
    libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
def probe(pid):
    return {
        'signal': attempt(lambda: os.kill(pid, 0)),
        'ptrace': attempt(lambda: trace(pid)),
        'environ': attempt(lambda: open(f'/proc/{pid}/environ', 'rb').read(1)),
        'mem': attempt(lambda: open(f'/proc/{pid}/mem', 'rb').read(1)),
        'fds': attempt(lambda: os.listdir(f'/proc/{pid}/fd')),
        'cwd': attempt(lambda: os.listdir(f'/proc/{pid}/cwd')),
    }
def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    finally:
        s.close()
mine = os.path.dirname(os.environ['IPYTHONDIR'])
"""
DENIED = {k: "denied" for k in ("signal", "ptrace", "environ", "mem", "fds", "cwd")}


def test_a_cell_cannot_signal_trace_or_read_the_worker_or_its_fork_server(
    apart: WorkerProcess,
) -> None:
    targets = {"worker": apart.proc.pid, "fork server": _fork_server(apart)}
    source = _PROBES + "results = {name: probe(pid) for name, pid in targets.items()}\n"
    with httpx.Client(base_url=apart.url, timeout=60) as c:
        given = [({"name": "targets", "format": "json/object"}, json.dumps(targets).encode())]
        bundle = run_ok(c, source, given)
    assert json.loads(bundle.file("results")) == dict.fromkeys(targets, DENIED)
    assert apart.proc.poll() is None


def test_a_cell_cannot_trace_read_or_connect_to_a_sibling_kernel(apart: WorkerProcess) -> None:
    kernels = _kernels(apart)
    assert len(kernels) == 2
    sockets = {str(folder): sorted(glob.glob(f"{folder}/ipc-*")) for folder in kernels.values()}
    assert all(len(paths) >= 3 for paths in sockets.values()), sockets
    pids = {str(folder): pid for pid, folder in kernels.items()}
    source = _PROBES + (
        "(sibling,) = [f for f in sockets if f != mine]\n"
        "results = probe(pids[sibling])\n"
        "reached = {p: attempt(lambda: connect(p)) for p in sockets[sibling]}\n"
        "own = {p: attempt(lambda: connect(p)) for p in sockets[mine]}\n"
        "folder = attempt(lambda: os.listdir(sibling))\n"
        "temp = attempt(lambda: os.listdir(os.path.join(sibling, 'tmp')))\n"
        "dumpable = libc.prctl(3, 0, 0, 0, 0)\n"  # PR_GET_DUMPABLE
    )
    given = [
        ({"name": "sockets", "format": "json/object"}, json.dumps(sockets).encode()),
        ({"name": "pids", "format": "json/object"}, json.dumps(pids).encode()),
    ]
    with httpx.Client(base_url=apart.url, timeout=60) as c:
        v = run_ok(c, source, given)
    assert json.loads(v.file("results")) == DENIED
    reached = json.loads(v.file("reached"))
    assert set(reached.values()) == {"denied"}, reached
    # the same connect reaches the cell's own kernel's sockets: the attack itself works
    assert set(json.loads(v.file("own")).values()) == {"done"}
    assert v.variables["folder"]["preview"] == "denied"
    assert v.variables["temp"]["preview"] == "denied"
    assert v.variables["dumpable"]["preview"] == 0
    assert set(_kernels(apart)) == set(kernels)  # both kernels are still there


def test_a_cell_cannot_read_another_requests_run_directory(apart: WorkerProcess) -> None:
    victim_source = (
        "import time\nopen('victim-secret.txt', 'w').write('the victim wrote this')\n"
        "time.sleep(3)\ndone = True\n"
    )
    with httpx.Client(base_url=apart.url, timeout=60) as c:
        victim = Background(c, victim_source, inputs=[
            ({"name": "given", "format": "json/object"}, b'"victim input"')])  # fmt: skip
        wait_active(c)
        deadline = time.monotonic() + 10
        while not (found := glob.glob(f"{apart.run_dir}/*/*/work/victim-secret.txt")):
            assert time.monotonic() < deadline, "the victim's run directory never appeared"
            time.sleep(0.05)
        run = str(Path(found[0]).parent.parent)
        attacker_source = (
            "import os\n"
            "def attempt(fn):\n"
            "    try:\n        fn()\n        return 'done'\n"
            "    except PermissionError:\n        return 'denied'\n"
            "tries = {\n"
            "    'list': attempt(lambda: os.listdir(run)),\n"
            "    'secret': attempt(lambda: open(os.path.join(run, 'work', 'victim-secret.txt')).read()),\n"
            "    'inputs': attempt(lambda: os.listdir(os.path.join(run, 'inputs'))),\n"
            "    'plant': attempt(lambda: open(os.path.join(run, 'work', 'planted'), 'w')),\n"
            "}\n"
            "mine = attempt(lambda: os.listdir(os.path.dirname(os.getcwd())))\n"
        )  # fmt: skip
        given = [({"name": "run", "format": "json/object"}, json.dumps(run).encode())]
        v = run_ok(c, attacker_source, given).variables
        victim_bundle = read_bundle(victim.response())
    assert victim_bundle.manifest["success"], victim_bundle.manifest
    assert json.loads(json.dumps(v["tries"]["preview"])) == dict.fromkeys(
        ("list", "secret", "inputs", "plant"), "denied"
    )
    assert v["mine"]["preview"] == "done"  # its own run directory is its to read


def test_every_reset_empties_the_temp_folder_whatever_modes_a_cell_left(
    apart: WorkerProcess,
) -> None:
    source = (
        "import os, tempfile\n"
        "tmp = tempfile.gettempdir()\n"
        "locked = os.path.join(tmp, 'locked', 'deeper')\n"
        "os.makedirs(locked)\n"
        "open(os.path.join(locked, 'left.txt'), 'w').write('left behind')\n"
        "open(os.path.join(tmp, 'unreadable.txt'), 'w').write('left behind')\n"
        "os.chmod(os.path.join(tmp, 'unreadable.txt'), 0)\n"
        "os.chmod(locked, 0)\n"
        "os.chmod(os.path.dirname(locked), 0)\n"
        "pid = os.getpid()\n"
    )
    with httpx.Client(base_url=apart.url, timeout=60) as c:
        v = run_ok(c, source).variables
    pid, folder = v["pid"]["preview"], Path(v["tmp"]["preview"])
    deadline = time.monotonic() + 10
    while True:  # the reset runs right after the reply
        if pid in _kernels(apart):
            if folder.is_dir() and not os.listdir(folder):
                break  # reset: emptied
        elif not folder.exists():
            break  # it could not be emptied: the kernel was retired, its folder removed
        assert time.monotonic() < deadline, f"{folder} still holds what the cell left"
        time.sleep(0.05)


def test_a_spawned_kernels_connection_file_is_private_and_gone_once_it_answered(
    spawned_apart: WorkerProcess,
) -> None:
    files = {}
    for pid in _kernels(spawned_apart):
        command = psutil.Process(pid).cmdline()
        assert "-f" in command, command  # a spawned kernel, given a connection file
        path = Path(command[command.index("-f") + 1])
        folder = path.parent.stat()
        assert stat.S_IMODE(folder.st_mode) & 0o777 == 0o700
        assert folder.st_uid == psutil.Process(pid).uids().real != 0
        assert not path.exists(), f"{path} outlived the kernel's first answer"
        files[pid] = str(path)
    source = (
        "import os\n"
        "def attempt(fn):\n"
        "    try:\n        fn()\n        return 'done'\n"
        "    except PermissionError:\n        return 'denied'\n"
        "    except FileNotFoundError:\n        return 'absent'\n"
        "others = [p for pid, p in files.items() if int(pid) != os.getpid()]\n"
        "tries = sorted({attempt(lambda: open(p).read()) for p in others})\n"
    )
    given = [({"name": "files", "format": "json/object"}, json.dumps(files).encode())]
    with httpx.Client(base_url=spawned_apart.url, timeout=60) as c:
        v = run_ok(c, source, given).variables
    assert v["tries"]["preview"] == ["denied"]


# every loopback TCP socket listening under another kernel uid of the range, found the way
# any process can (/proc/net/tcp names each socket's uid), is sent a message as ipykernel's
# subprocess-output pipe would receive it
_INJECT = """
import os, zmq
own = os.getuid()
ports = set()
for line in open('/proc/net/tcp').read().splitlines()[1:]:
    fields = line.split()
    address, port = fields[1].split(':')
    uid = int(fields[7])
    if fields[3] == '0A' and address == '0100007F' and first <= uid <= last and uid != own:
        ports.add(int(port, 16))
ctx = zmq.Context()
for port in sorted(ports):
    push = ctx.socket(zmq.PUSH)
    push.linger = 1000
    push.connect(f'tcp://127.0.0.1:{port}')
    push.send_multipart([b'0123456789abcdef', b'INJECTED-BY-A-SIBLING-KERNEL'])
    push.close()
ctx.term()
reached = sorted(ports)
"""


def test_a_cell_cannot_reach_a_sibling_kernel_over_loopback_tcp(apart: WorkerProcess) -> None:
    with httpx.Client(base_url=apart.url, timeout=60) as c:
        meta = running_cell("import time\ntime.sleep(2)\nprint('victim done')", "victim")
        victim = Background(c, "", metadata=meta)
        wait_running(c, "victim")  # the victim's cell is running on the other kernel
        uids = [({"name": "first", "format": "json/object"}, str(FIRST_UID).encode()),
                ({"name": "last", "format": "json/object"}, str(FIRST_UID + 7).encode())]  # fmt: skip
        attacker = run_ok(c, _INJECT, uids).variables
        victim_bundle = read_bundle(victim.response())
    assert victim_bundle.manifest["success"], victim_bundle.manifest
    assert "INJECTED-BY-A-SIBLING-KERNEL" not in victim_bundle.stderr()
    assert attacker["reached"]["preview"] == []  # no sibling's socket to connect to
