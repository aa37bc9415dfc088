"""``--kernel-user FIRST-LAST``: a uid used again starts clean, and none is left dirty.

Two uids for one kernel and ``--recycle fresh``: every request gets a never-used kernel,
and every other kernel the same uid. A cell leaves what a uid can leave outside its kernel's folder (mode-0600
files in ``/dev/shm``, ``/tmp``, ``/var/tmp``, a folder tree in ``/tmp``, System V shared
memory, a semaphore set and a message queue); the next request's kernel, on the same uid,
(and the one between) finds none of it; and once the worker stopped, nothing of that uid remains. The run
directories sit in a folder anyone may write in, as ``/dev/shm`` is (the worker's default
run root): the sweep leaves a request's own run directory to the worker. Needs root and an
interpreter any uid can run; elsewhere it is skipped, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import httpx
import pytest

from kernel_pool.leftovers import SHARED_FOLDERS, ipc_objects
from tests.conftest import kernel_uid_unavailable, start_worker
from tests.wire import run_ok

UID = 33000  # apart from the other uid tests' ranges
UIDS = (UID, UID + 1)
_WHY_NOT = kernel_uid_unavailable(UID)
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT))

KEY = 0x5EED0000 + os.getpid() % 0xFFFF  # System V keys of this run
NAMES = [f"{folder}/left-by-a-request-{KEY}" for folder in ("/dev/shm", "/tmp", "/var/tmp")]
TREE = f"/tmp/tree-left-by-a-request-{KEY}"
LEAVE = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for name in {NAMES!r}:
    fd = os.open(name, os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, b'secret')
    os.close(fd)
os.makedirs({TREE!r} + '/inner', mode=0o700)
with open({TREE!r} + '/inner/file', 'w') as fh:
    fh.write('secret')
ids = [libc.shmget({KEY}, 1 << 20, 0o1600), libc.semget({KEY + 1}, 1, 0o1600),
       libc.msgget({KEY + 2}, 0o1600)]
assert min(ids) >= 0, ids
print(os.getuid())
"""
SEE = f"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
files = [name for name in {[*NAMES, TREE]!r} if os.path.lexists(name)]
ipc = [libc.shmget({KEY}, 0, 0), libc.semget({KEY + 1}, 0, 0), libc.msgget({KEY + 2}, 0, 0)]
print(json.dumps({{"uid": os.getuid(), "files": files, "ipc": ipc}}))
"""


def _owned_by(uid: int) -> list[str]:
    """What ``uid`` owns in the shared folders (and the folders below them anyone may
    write in)."""
    found, folders = [], list(SHARED_FOLDERS)
    while folders:
        try:
            entries = list(os.scandir(folders.pop()))
        except OSError:
            continue
        for entry in entries:
            info = entry.stat(follow_symlinks=False)
            if info.st_uid == uid:
                found.append(entry.path)
            elif stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IWOTH:
                folders.append(entry.path)
    return found


@pytest.mark.timeout(180)
def test_a_fresh_kernel_on_a_used_uid_sees_nothing_an_earlier_one_left(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    runs = Path(tempfile.mkdtemp(prefix="skw-test-runs-"))
    runs.chmod(0o1777)  # anyone may write here, as in /dev/shm
    worker = start_worker(
        tmp_path_factory, "--pool-size", "1", "--kernel-user", f"{UIDS[0]}-{UIDS[1]}",
        "--recycle", "fresh", run_dir=runs,
    )  # fmt: skip
    try:
        with httpx.Client(base_url=worker.url, timeout=120) as client:
            left_by = int(run_ok(client, LEAVE).stdout())
            seen = [json.loads(run_ok(client, SEE).stdout()) for _ in range(3)]
            assert left_by in {s.pop("uid") for s in seen}  # a kernel got that uid again
            assert seen == [{"files": [], "ipc": [-1, -1, -1]}] * 3
            run_ok(client, LEAVE)  # left for the worker's stop
    finally:
        worker.stop()
        shutil.rmtree(runs, ignore_errors=True)
    for uid in UIDS:
        assert _owned_by(uid) == []
        assert ipc_objects(uid) == []
