"""A cell that breaks its run directory gets a cell error or a warning, never a 500.

Every folder the worker makes in a run directory, and every name it writes a file at after
the cell, is replaced by a cell with a symbolic link, a regular file or a FIFO (a folder is
also removed), on the push route and on the pull route, through a real worker. Where the
cell's results were to be collected the answer is ``success: false`` with an error naming
what it broke; elsewhere the answer is whole and a line in stderr names it. Each link
points at a folder (or a file) of the test's holding a canary: nothing may be written there
(its contents stay as they were), nor read from there (the canary appears in no bundle
member and in no file streamed to the store).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import WorkerProcess, start_worker
from tests.fake_store import FakeStore
from tests.wire import execute, read_bundle

CANARY = b"run-dir-tampering-canary-7c41"
WARNING = "[strata-kernel-worker] "

# Folders the worker makes before the cell: (path below the run directory, results lost).
FOLDERS = {
    "files": True,  # the variables
    "display": True,  # the displays' mime files
    "dirs": True,  # the output folders' parent
    "dirs/plots": True,  # an output folder
    "inputs": False,  # read before the cell only
    "work": False,  # the cell's own working directory
}
# Names the worker (or its agent) writes a file at after the cell.
FILES = ("agent-report.json", "bundle.tar.gz", "files/x.json", "display/0.html")
KINDS = ("link", "file", "fifo")

CELL = """\
# @output_dir plots
import os, shutil
from IPython.display import HTML, display
root = os.path.dirname(os.getcwd())
os.chdir(root)
path = os.path.join(root, {name!r})
if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path)
elif os.path.lexists(path):
    os.unlink(path)
kind = {kind!r}
if kind == "link":
    os.symlink({target!r}, path)
elif kind == "file":
    with open(path, "w") as planted:
        planted.write("planted by the cell")
elif kind == "fifo":
    os.mkfifo(path)
print("the cell ran")
display(HTML("<b>shown</b>"))
x = 1
"""


@pytest.fixture(scope="module")
def store() -> Iterator[FakeStore]:
    with FakeStore() as fake:
        yield fake


@pytest.fixture(scope="module")
def tamper_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """One worker for both routes (the pull route's store listens on loopback)."""
    env = {"STRATA_WORKER_ALLOW_LOCAL_HOSTS": "1"}
    w = start_worker(tmp_path_factory, "--pool-size", "2", env=env)
    yield w
    w.stop()


@pytest.fixture(scope="module")
def client(tamper_worker: WorkerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=tamper_worker.url, timeout=60) as c:
        yield c


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A folder of the test's that links point into: it must end as it began."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "secret.txt").write_bytes(CANARY)
    return folder


def run(
    route: str, client: httpx.Client, store: FakeStore, source: str
) -> tuple[dict[str, Any], dict[str, bytes], list[bytes]]:
    """(manifest, members, bodies streamed to the store) of the cell's bundle."""
    if route == "push":
        bundle = read_bundle(execute(client, source))
        return bundle.manifest, bundle.members, []
    key = uuid.uuid4().hex[:12]
    params = {"source": source, "timeout_seconds": 60.0, "input_specs": {}}
    body = {
        "build_id": f"nbbuild-{key}",
        "metadata": {"executor_ref": "notebook_cell@v1", "params": params},
        "inputs": [],
        "output": {"url": f"{store.url}/upload/{key}"},
        "finalize_url": f"{store.url}/finalize/{key}?sig=1",
        "output_file_url": f"{store.url}/output-file/{key}?sig=2",
    }
    response = client.post("/v1/execute-manifest", json=body)
    assert response.status_code == 200, response.text
    stored = store.bundle(key)
    return stored.manifest, stored.members, list(store.output_files.get(key, {}).values())


def assert_untouched(elsewhere: Path, members: dict[str, bytes], streamed: list[bytes]) -> None:
    """Nothing written through a link (the folder as it was), nothing read through one."""
    assert sorted(p.name for p in elsewhere.iterdir()) == ["secret.txt"]
    assert (elsewhere / "secret.txt").read_bytes() == CANARY
    assert not [name for name, data in members.items() if CANARY in data]
    assert not [data for data in streamed if CANARY in data]


def source_for(name: str, kind: str, elsewhere: Path, *, folder: bool) -> str:
    target = elsewhere if folder else elsewhere / "secret.txt"
    return CELL.format(name=name, kind=kind, target=str(target))


@pytest.mark.parametrize("route", ["push", "pull"])
@pytest.mark.parametrize("kind", [*KINDS, "removed"])
@pytest.mark.parametrize("name", list(FOLDERS))
def test_a_folder_of_the_worker_replaced(
    client: httpx.Client, store: FakeStore, elsewhere: Path, route: str, name: str, kind: str
) -> None:
    source = source_for(name, kind, elsewhere, folder=True)
    manifest, members, streamed = run(route, client, store, source)
    assert_untouched(elsewhere, members, streamed)
    assert members["stdout.txt"] == b"the cell ran\n"
    did = "removed" if kind == "removed" else "replaced"
    if FOLDERS[name]:
        assert manifest["success"] is False, manifest
        assert f"The cell {did} {name}/ " in manifest["error"]
        assert "could not be collected" in manifest["error"]
        assert manifest["variables"] == {}
        assert WARNING not in members["stderr.txt"].decode()  # said once, as the error
    else:
        assert manifest["success"] is True, manifest
        assert manifest["variables"]["x"]["preview"] == 1
        stderr = members["stderr.txt"].decode()
        assert f"{WARNING}The cell {did} {name}/ " in stderr
        assert members["display/0.html"] == b"<b>shown</b>"


@pytest.mark.parametrize("route", ["push", "pull"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", FILES)
def test_a_name_the_worker_writes_at_taken(
    client: httpx.Client, store: FakeStore, elsewhere: Path, route: str, name: str, kind: str
) -> None:
    """What the cell put there is set aside unread; the worker's own file is written."""
    source = source_for(name, kind, elsewhere, folder=False)
    manifest, members, streamed = run(route, client, store, source)
    assert_untouched(elsewhere, members, streamed)
    assert manifest["success"] is True, manifest
    assert members[manifest["variables"]["x"]["file"]] == b"1"
    assert members["display/0.html"] == b"<b>shown</b>"
    assert f"{WARNING}The cell put " in members["stderr.txt"].decode()
    assert f" at {name} in its run directory" in members["stderr.txt"].decode()


def test_the_issue_s_cell_is_a_cell_error(client: httpx.Client) -> None:
    """``display/`` swapped for a link to ``/etc``, then an HTML display: it was a 500."""
    source = (
        "import os, shutil\nfrom IPython.display import HTML, display\n"
        "shutil.rmtree('../display')\nos.symlink('/etc', '../display')\n"
        "display(HTML('<b>x</b>'))\n"
    )
    response = execute(client, source)
    assert response.status_code == 200, response.text
    manifest = read_bundle(response).manifest
    assert manifest["success"] is False
    assert manifest["error"].startswith("The cell replaced display/ in its run directory with a")


def test_a_cell_that_fails_keeps_its_error_and_hears_of_the_rest(
    client: httpx.Client, elsewhere: Path
) -> None:
    source = source_for("files", "link", elsewhere, folder=True) + "raise KeyError('own')\n"
    bundle = read_bundle(execute(client, source))
    assert bundle.manifest["success"] is False
    assert bundle.manifest["error"] == "'own'"
    assert f"{WARNING}The cell replaced files/ in its run directory with a symbolic link" in (
        bundle.stderr()
    )


def test_a_folder_without_results_to_collect_is_only_a_warning(client: httpx.Client) -> None:
    """No display shown: a broken display folder costs nothing, and says so in stderr."""
    bundle = read_bundle(execute(client, "import shutil\nshutil.rmtree('../display')\nx = 1\n"))
    assert bundle.manifest["success"] is True
    assert bundle.variables["x"]["preview"] == 1
    assert f"{WARNING}The cell removed display/ from its run directory" in bundle.stderr()


@pytest.mark.parametrize(
    "name", ["stdout.txt", "stderr.txt", "console.json", "error.json", "manifest.json"]
)
def test_bundle_member_names_in_the_run_directory_are_not_read(
    client: httpx.Client, elsewhere: Path, name: str
) -> None:
    """The console and the manifest are built in memory: a link at their names in the run
    directory is never read."""
    source = source_for(name, "link", elsewhere, folder=False)
    bundle = read_bundle(execute(client, source))
    assert_untouched(elsewhere, bundle.members, [])
    assert bundle.manifest["success"] is True
    assert bundle.stdout() == "the cell ran\n"
    assert WARNING not in bundle.stderr()
