"""``--kernel-user``: kernels run as an unprivileged user, out of reach of the worker's secrets.

Needs root and an interpreter the unprivileged user can execute (CI makes sure of both);
elsewhere it is skipped, saying why.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import WorkerProcess, start_worker
from tests.wire import execute, read_bundle, run_ok

USER = "nobody"
TOKEN = "kernel-user-token-4242"


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        return f"no user {USER!r}"
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import ipykernel"],
            user=entry.pw_uid, group=entry.pw_gid, extra_groups=[],
            capture_output=True, check=False,
        )  # fmt: skip
    except OSError:
        probe = None
    if probe is None or probe.returncode != 0:
        return f"{USER} cannot run {sys.executable} (a parent directory is private)"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


@pytest.fixture(scope="module")
def confined(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    # pytest's own temp dirs are private to root: runs go where the kernel user can reach
    runs = tempfile.mkdtemp(prefix="skw-test-runs-")
    os.chmod(runs, 0o711)
    w = start_worker(
        tmp_path_factory, "--pool-size", "2", "--kernel-user", USER, "--run-dir", runs,
        env={"STRATA_WORKER_TOKEN": TOKEN},
    )  # fmt: skip
    try:
        yield w
    finally:
        w.stop()
        leftovers = os.listdir(runs)
        shutil.rmtree(runs, ignore_errors=True)
        assert not leftovers, f"run directories left behind: {leftovers}"


def test_kernels_run_confined(confined: WorkerProcess) -> None:
    source = (
        "import os, glob, json, pathlib\n"
        "uid = os.getuid()\n"
        "def attempt(fn):\n"
        "    try:\n"
        "        fn()\n"
        "        return 'read'\n"
        "    except PermissionError:\n"
        "        return 'denied'\n"
        "    except FileNotFoundError:\n"
        "        return 'absent'\n"
        # the worker, and the kernel's parent (the fork server, which runs as root too)
        "parents = {worker, os.getppid()}\n"
        "environ = sorted({attempt(lambda: open(f'/proc/{p}/environ', 'rb').read()) for p in parents})\n"
        "memory = sorted({attempt(lambda: open(f'/proc/{p}/mem', 'rb').read(1)) for p in parents})\n"
        "private = pathlib.Path(os.environ['IPYTHONDIR']).parent.parent\n"
        "listing = attempt(lambda: os.listdir(private))\n"
        "keys = [p for p in glob.glob(str(private / '*' / 'connection.json'))]\n"
        "run_parent = attempt(lambda: os.listdir(pathlib.Path.cwd().parent.parent))\n"
        "(pathlib.Path.cwd() / 'scratch.txt').write_text('the work dir is writable')\n"
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=confined.url, timeout=60, headers=auth) as c:
        worker = ({"name": "worker", "format": "json/object"}, str(confined.proc.pid).encode())
        bundle = run_ok(c, source, [({"name": "value", "format": "json/object"}, b"41"), worker])
        v = bundle.variables
        assert v["uid"]["preview"] == pwd.getpwnam(USER).pw_uid
        assert v["environ"]["preview"] == ["denied"]
        assert v["memory"]["preview"] == ["denied"]
        assert v["listing"]["preview"] == "denied"  # other kernels' dirs cannot be listed
        assert v["keys"]["preview"] == []  # connection files are gone once kernels start
        assert v["run_parent"]["preview"] == "denied"  # other requests' run dirs are unlisted
        # inputs are readable, outputs writable: a normal cell works
        result = run_ok(c, "y = value + 1", [({"name": "value", "format": "json/object"}, b"41")])
        assert result.variables["y"]["preview"] == 42


def test_kernels_cannot_read_each_other(confined: WorkerProcess) -> None:
    """Two kernels share the unprivileged user, yet neither can read the other's memory."""
    pids = sorted(confined.remember_kernels())
    source = (
        "import os\n"
        "def attempt(path):\n"
        "    try:\n"
        "        open(path, 'rb').read(1)\n"
        "        return 'read'\n"
        "    except PermissionError:\n"
        "        return 'denied'\n"
        "    except (FileNotFoundError, ProcessLookupError, OSError):\n"
        "        return 'absent'\n"
        "others = [p for p in targets if p != os.getpid()]\n"
        "results = sorted({attempt(f'/proc/{p}/{what}') for p in others\n"
        "                  for what in ('mem', 'environ')})\n"
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=confined.url, timeout=60, headers=auth) as c:
        targets = [({"name": "targets", "format": "json/object"}, json.dumps(pids).encode())]
        bundle = run_ok(c, source, targets)
    assert bundle.variables["results"]["preview"] == ["denied"]


# -- the run directory is the cell's: links and FIFOs it plants there are never followed ------


@pytest.fixture
def root_only() -> Iterator[str]:
    """A folder only root may enter, holding ``secret.json`` (what a cell must never reach)."""
    folder = tempfile.mkdtemp(prefix="skw-root-only-")
    os.chmod(folder, 0o700)
    with open(os.path.join(folder, "secret.json"), "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"error": "ROOT-ONLY-SECRET"}))
    os.chmod(os.path.join(folder, "secret.json"), 0o600)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _answer(worker: WorkerProcess, source: str) -> httpx.Response:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=worker.url, timeout=60, headers=auth) as c:
        return execute(c, source)


def test_a_display_file_the_cell_linked_elsewhere_is_not_written_through(
    confined: WorkerProcess, root_only: str
) -> None:
    target = os.path.join(root_only, "secret.json")
    before = Path(target).read_bytes()
    source = (
        f"import os\nos.symlink({target!r}, '../display/0.txt')\n"
        "os.mkfifo('../display/1.txt')\n"  # would hang a worker thread that opened it
        "os.mkdir('../display/2.txt')\n"
        "from IPython.display import display\ndisplay('first')\ndisplay('second')\n"
        "display('third')\n"
    )
    bundle = read_bundle(_answer(confined, source))
    assert Path(target).read_bytes() == before  # the root-only file is untouched
    # the worker wrote its own files instead (the Jupyter displays' mime files)
    assert bundle.members["display/0.txt"] == b"'first'"
    assert bundle.members["display/1.txt"] == b"'second'"
    assert bundle.members["display/2.txt"] == b"'third'"


def test_a_report_the_cell_linked_to_a_root_only_file_is_not_read(
    confined: WorkerProcess, root_only: str
) -> None:
    target = os.path.join(root_only, "secret.json")
    before = Path(target).read_bytes()
    source = f"import os\nos.symlink({target!r}, '../agent-report.json')\nx = 1\n"
    bundle = read_bundle(_answer(confined, source))
    assert not [name for name, data in bundle.members.items() if b"ROOT-ONLY-SECRET" in data]
    assert Path(target).read_bytes() == before
    # the agent set the link aside and wrote its report as a new file
    assert bundle.manifest["success"] is True
    assert bundle.variables["x"]["preview"] == 1
    assert "a symbolic link at agent-report.json" in bundle.stderr()


def test_an_output_folder_the_cell_swapped_for_a_link_lists_nothing(
    confined: WorkerProcess, root_only: str
) -> None:
    source = f"# @output_dir plots\nimport os\nos.rmdir(plots)\nos.symlink({root_only!r}, plots)\n"
    response = _answer(confined, source)
    assert "secret" not in response.text
    assert read_bundle(response).manifest["output_dirs"] == {"plots": {}}
