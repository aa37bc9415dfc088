"""``--kernel-user FIRST-LAST``: each kernel runs as a uid of its own, and cannot reach another.

The attacks are the ones that took over a sibling kernel when kernels shared one user: kill
it, read the replacement's connection file and sign requests to it; and the same aimed at a
kernel that is running someone else's request right now. Needs root and an interpreter any
uid can execute (CI makes sure of both); elsewhere it is skipped, saying why.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from tests.conftest import WorkerProcess, kernel_uid_unavailable, start_worker
from tests.wire import execute, read_bundle, run_ok, running_cell, wait_running

FIRST_UID = 31000
UIDS = f"{FIRST_UID}-{FIRST_UID + 7}"


_WHY_NOT = kernel_uid_unavailable(FIRST_UID)
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT))

# kill every other process it can, then look for a sibling's connection file and, with it,
# sign a request to that kernel (what worked when kernels shared one user)
_TAKE_OVER = """
import os, time, json, signal, glob
me = os.getpid()
killed = 0
for p in os.listdir('/proc'):
    if p.isdigit() and int(p) != me:
        try:
            os.kill(int(p), signal.SIGKILL)
            killed += 1
        except Exception:
            pass
here = os.environ['TMPDIR']
pool_dir = os.path.dirname(os.path.dirname(here))
stolen = None
deadline = time.time() + 3
while time.time() < deadline and stolen is None:
    for n in range(1, 40):
        try:
            stolen = open(f'{pool_dir}/k{n}/connection.json').read()
            break
        except OSError:
            pass
    time.sleep(0.005)
reached = []
for sock in glob.glob(f'{pool_dir}/k*/ipc-*'):
    try:
        import socket
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock)
        reached.append(sock)
        s.close()
    except OSError:
        pass
try:
    listed = os.listdir(pool_dir)
except OSError:
    listed = None
"""


@pytest.fixture(scope="module")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    runs = tempfile.mkdtemp(prefix="skw-test-runs-")
    os.chmod(runs, 0o711)
    w = start_worker(
        tmp_path_factory, "--pool-size", "2", "--kernel-user", UIDS, "--run-dir", runs,
        "--queue-wait", "30",
    )  # fmt: skip
    try:
        yield w
    finally:
        w.stop()
        shutil.rmtree(runs, ignore_errors=True)


def _kernel_uids(worker: WorkerProcess) -> dict[int, int]:
    children = psutil.Process(worker.proc.pid).children()
    return {p.pid: p.uids().real for p in children if "ipykernel" in " ".join(p.cmdline())}


def test_each_kernel_runs_as_its_own_uid(isolated: WorkerProcess) -> None:
    uids = _kernel_uids(isolated)
    assert len(uids) == 2 and len(set(uids.values())) == 2
    assert all(FIRST_UID <= uid <= FIRST_UID + 7 for uid in uids.values())
    with httpx.Client(base_url=isolated.url, timeout=60) as client:
        bundle = run_ok(
            client,
            "import os, tempfile\n"
            "ids = [os.getuid(), os.getgid(), os.getgroups()]\n"
            "tmp = tempfile.gettempdir()\nmode = oct(os.stat(tmp).st_mode & 0o777)\n"
            "owner = os.stat(tmp).st_uid\n",
        )
    uid, gid, groups = bundle.variables["ids"]["preview"]
    assert uid in uids.values() and gid == uid and groups == []
    assert bundle.variables["mode"]["preview"] == "0o700"
    assert bundle.variables["owner"]["preview"] == uid


def test_a_cell_cannot_kill_or_take_over_a_sibling(isolated: WorkerProcess) -> None:
    before = _kernel_uids(isolated)
    with httpx.Client(base_url=isolated.url, timeout=60) as client:
        bundle = run_ok(client, _TAKE_OVER)
        after = _kernel_uids(isolated)
    assert bundle.variables["stolen"]["preview"] is None  # no key on disk to find
    assert bundle.variables["reached"]["preview"] == []  # no sibling's socket to connect to
    assert bundle.variables["listed"]["preview"] is None  # the pool's folder is unlistable
    # the sibling was not killed: only the attacker's own processes could be signalled
    assert set(before) - {p for p in before if p not in after} == set(before) & set(after)
    assert len(set(before) & set(after)) >= 1


def test_a_cell_cannot_kill_a_kernel_running_another_request(isolated: WorkerProcess) -> None:
    with httpx.Client(base_url=isolated.url, timeout=60) as client:
        results: list[httpx.Response] = []
        meta = running_cell("import time\ntime.sleep(2)\nvictim = 'finished'", "victim")
        victim = threading.Thread(target=lambda: results.append(execute(client, "", metadata=meta)))
        victim.start()
        wait_running(client, "victim")  # the victim's cell is running on the other kernel
        run_ok(client, _TAKE_OVER)
        victim.join(30)
    bundle = read_bundle(results[0])
    assert bundle.manifest["success"], bundle.manifest
    assert bundle.variables["victim"]["preview"] == "finished"


def test_what_a_kernel_leaves_is_killed_before_its_uid_is_used_again(
    isolated: WorkerProcess,
) -> None:
    """A daemon (setsid and a double fork) escapes a children walk, not its uid."""
    with httpx.Client(base_url=isolated.url, timeout=60) as client:
        bundle = run_ok(
            client,
            "import os, subprocess, sys\n"
            "# the subreaper flag cleared: an orphan would go to init, out of the tree\n"
            "import ctypes\nctypes.CDLL(None).prctl(36, 0, 0, 0, 0)\n"
            "code = 'import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n    time.sleep(300)'\n"
            "subprocess.run([sys.executable, '-c', code])\n"
            "uid = os.getuid()\n",
        )
        uid = bundle.variables["uid"]["preview"]
        deadline = time.monotonic() + 20
        while [p for p in psutil.process_iter(["uids"]) if p.info["uids"].real == uid]:
            # retired (a process left running), and everything of its uid killed
            assert time.monotonic() < deadline, "a process of the retired kernel's uid lives on"
            time.sleep(0.1)
        health = client.get("/health").json()["pool"]
        assert health["retirements"]["failed_reset"] >= 1
