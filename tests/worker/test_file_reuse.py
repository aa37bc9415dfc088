"""Large files of finished runs, kept for later inputs and outputs: what is kept, what is never
kept, and that an input or output written over a kept file is exactly the new value."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest

from kernel_worker.agent import arrow_codec
from kernel_worker.runs.directory import sweep_stale_run_dirs
from kernel_worker.runs.reuse import (
    MIN_FILE_BYTES,
    ReusableFiles,
    keep_and_remove,
    open_reused,
)
from kernel_worker.settings import memory_backed
from tests.conftest import WorkerProcess, start_worker, wait_gone
from tests.fake_store import FakeStore
from tests.wire import execute, read_bundle, run_ok
from tests.worker.test_pull import manifest

SHM = Path("/dev/shm")
MB = 1 << 20


@pytest.fixture
def where() -> Iterator[Path]:
    """A folder on a memory filesystem when there is one (as the worker's run root)."""
    base = SHM if memory_backed(SHM) and os.access(SHM, os.W_OK) else None
    folder = Path(tempfile.mkdtemp(prefix="skw-reuse-test-", dir=base))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _file(path: Path, size: int, fill: bytes = b"x") -> str:
    path.write_bytes(fill * size)
    return str(path)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_large_file_is_kept_and_written_over_with_nothing_stale_left(where: Path) -> None:
    files = ReusableFiles(where / "kept", 64 * MB)
    old = _file(where / "old", 3 * MB, b"o")
    assert files.keep(old)
    assert not os.path.exists(old) and files.count == 1 and files.held_bytes == 3 * MB
    dest = where / "new"
    fd = open_reused(files, dest, 2 * MB)
    assert fd is not None and files.count == 0
    try:
        os.write(fd, b"n" * (2 * MB + 5))
        os.ftruncate(fd, 2 * MB + 5)
    finally:
        os.close(fd)
    assert dest.read_bytes() == b"n" * (2 * MB + 5)
    assert dest.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_small_linked_linked_to_and_foreign_files_are_not_kept(where: Path) -> None:
    files = ReusableFiles(where / "kept", 64 * MB)
    small = _file(where / "small", MIN_FILE_BYTES - 1)
    linked = _file(where / "linked", 2 * MB)
    os.link(linked, where / "second-name")
    os.symlink(linked, where / "symlink")
    (where / "dir").mkdir()
    for path in (small, linked, str(where / "symlink"), str(where / "dir"), str(where / "gone")):
        assert not files.keep(path)
    assert os.path.exists(small) and os.path.exists(linked) and files.count == 0


def test_the_budget_bounds_what_is_kept(where: Path) -> None:
    files = ReusableFiles(where / "kept", 5 * MB)
    assert files.keep(_file(where / "a", 3 * MB))
    assert not files.keep(_file(where / "b", 3 * MB))
    assert files.keep(_file(where / "c", 2 * MB))
    assert files.held_bytes == 5 * MB
    free = os.statvfs(where).f_bavail * os.statvfs(where).f_frsize
    roomy = ReusableFiles(where / "kept-2", free // 2 + MB)  # the filesystem lacks 2x that
    assert not roomy.keep(_file(where / "d", 2 * MB))


def test_the_best_fitting_file_is_taken_and_none_far_too_large(where: Path) -> None:
    files = ReusableFiles(where / "kept", 64 * MB)
    for name, size in (("a", 3 * MB), ("b", 5 * MB), ("c", 9 * MB)):
        assert files.keep(_file(where / name, size))
    assert not files.take(where / "tiny", MIN_FILE_BYTES - 1)  # not worth it
    assert files.take(where / "t1", 4 * MB)  # the smallest one large enough: 5 MB
    assert (where / "t1").stat().st_size == 5 * MB
    assert files.take(where / "t2", 12 * MB)  # none large enough: the largest, 9 MB
    assert (where / "t2").stat().st_size == 9 * MB
    assert not files.take(where / "t3", MIN_FILE_BYTES)  # 3 MB is over twice as large
    assert files.count == 1
    (where / "taken").write_bytes(b"")
    assert not files.take(where / "taken", 3 * MB)  # never over an existing name
    assert (where / "taken").read_bytes() == b""


def test_idle_files_are_released_and_close_removes_the_folder(where: Path) -> None:
    clock = _Clock()
    files = ReusableFiles(where / "kept", 64 * MB, idle_seconds=60, clock=clock)
    assert files.keep(_file(where / "a", 2 * MB))
    clock.now += 30
    assert files.keep(_file(where / "b", 2 * MB))
    clock.now += 31
    assert files.release_idle() == 1
    assert files.count == 1 and len(os.listdir(where / "kept")) == 1
    files.close()
    assert not (where / "kept").exists() and files.count == 0


@pytest.mark.parametrize("how", ["mapped", "open"])
def test_a_file_another_process_still_maps_or_holds_open_is_not_kept(where: Path, how: str) -> None:
    path = _file(where / "held", 2 * MB)
    hold = {
        # an mmap outlives its descriptor: a kept Arrow buffer over an input file
        "mapped": "import mmap,os;fd=os.open(P,os.O_RDONLY);m=mmap.mmap(fd,0,prot=mmap.PROT_READ)"
        ";os.close(fd)",
        "open": "import os;fd=os.open(P,os.O_RDONLY)",
    }[how]
    code = f"import sys,time;P={path!r};{hold};print('ready',flush=True);sys.stdin.read()"
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as holder:  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
            files = ReusableFiles(where / "kept", 64 * MB)
            assert not files.keep(path)
            assert os.path.exists(path) and files.count == 0
        finally:
            holder.kill()
            holder.wait()
    wait_gone([holder.pid], 5, "the holder outlived the test")
    assert files.keep(path)  # nobody holds it any more


def test_offered_files_a_kernel_took_are_forgotten(where: Path) -> None:
    files = ReusableFiles(where / "kept", 64 * MB)
    for size in (2 * MB, 3 * MB, 4 * MB):
        assert files.keep(_file(where / f"f{size}", size))
    offered = files.offer(limit=2)
    assert [size for _, size in offered] == [4 * MB, 3 * MB]  # the newest first
    os.rename(offered[0][0], where / "taken")  # what the kernel's agent does
    files.forget_taken(offered)
    assert files.count == 2 and files.held_bytes == 5 * MB
    assert files.take(where / "again", 4 * MB - 10)  # from what is left: the 3 MB file
    assert os.path.getsize(where / "again") == 3 * MB
    files.close()


def _stream_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def test_the_agent_writes_a_large_output_over_an_offered_file(where: Path) -> None:
    import pandas as pd

    spare = _file(where / "spare", 3 * MB, b"\xff")  # stale bytes, longer than the output
    too_large = _file(where / "too-large", 9 * MB)
    inode = os.stat(spare).st_ino
    values = np.arange(2 * MB // 8 + 777, dtype="float64")
    arrow_codec.offer_spares([[too_large, 9 * MB], [spare, 3 * MB]])
    try:
        meta = arrow_codec.write(pd.DataFrame({"v": values}), where / "out.arrow")
    finally:
        arrow_codec.offer_spares(None)
    out = where / "out.arrow"
    st = out.stat()
    assert st.st_ino == inode and not os.path.exists(spare)  # the spare became the output
    assert os.path.exists(too_large)  # more than twice the output: not taken
    assert st.st_mode & 0o777 == 0o666 & ~_umask()
    expected = _stream_bytes(arrow_codec.to_table(pd.DataFrame({"v": values})))
    assert meta["bytes"] == st.st_size == len(expected)  # cut to its own length
    assert out.read_bytes() == expected  # nothing stale after it


def test_the_agent_writes_a_new_file_when_no_offered_file_fits(where: Path) -> None:
    import pandas as pd

    small = pd.DataFrame({"v": np.arange(1000, dtype="float64")})  # under 1 MiB: never
    spare = _file(where / "spare", 2 * MB)
    arrow_codec.offer_spares([[spare, 2 * MB], [str(where / "vanished"), 2 * MB]])
    try:
        arrow_codec.write(small, where / "small.arrow")
        assert os.path.exists(spare)
        os.unlink(spare)  # taken by the worker meanwhile: the agent writes a new file
        large = pd.DataFrame({"v": np.arange(200_000, dtype="float64")})
        meta = arrow_codec.write(large, where / "large.arrow")
    finally:
        arrow_codec.offer_spares(None)
    assert meta["bytes"] == (where / "large.arrow").stat().st_size
    table = pa.ipc.open_stream((where / "large.arrow").read_bytes()).read_all()
    assert table.num_rows == 200_000


def test_a_run_directory_leaves_its_large_files_and_goes(where: Path) -> None:
    files = ReusableFiles(where / "kept", 64 * MB)
    root = where / "run"
    (root / "inputs").mkdir(parents=True)
    (root / "files").mkdir()
    _file(root / "inputs" / "df.arrow", 2 * MB)
    _file(root / "files" / "out.arrow", 3 * MB)
    _file(root / "files" / "small.json", 10)
    elsewhere = where / "elsewhere"
    elsewhere.mkdir()
    outside = _file(elsewhere / "data.bin", 2 * MB)
    (root / "files" / "linked-dir").symlink_to(elsewhere)  # links are never followed
    keep_and_remove(root, files)
    assert not root.exists() and files.count == 2
    assert Path(outside).read_bytes() == b"x" * (2 * MB)
    keep_and_remove(where / "already-gone", files)  # nothing to do, nothing raised


def test_the_kept_files_of_a_worker_that_died_are_swept(where: Path) -> None:
    with subprocess.Popen([sys.executable, "-c", "pass"]) as gone:
        pass
    (where / f"skw-kept-{gone.pid}").mkdir()
    _file(where / f"skw-kept-{gone.pid}" / "abc", 2 * MB)
    (where / f"skw-kept-{os.getpid()}").mkdir()  # a live worker's: left alone
    (where / f"skw-kept-{gone.pid}-other").mkdir()  # not a kept-files folder: left alone
    assert sweep_stale_run_dirs(where) == 1
    left = {p.name for p in where.iterdir()}
    assert left == {f"skw-kept-{gone.pid}-other", f"skw-kept-{os.getpid()}"}


# -- through the worker ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reuse_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """One kernel (requests land on the same one), a run root of its own."""
    worker = start_worker(tmp_path_factory, "--pool-size", "1")
    if not memory_backed(worker.run_dir):
        worker.stop()
        pytest.skip("files are only kept on a memory filesystem, and there is none here")
    yield worker
    worker.stop()  # which also checks that the kept files went with the worker


def _kept(worker: WorkerProcess) -> list[Path]:
    folders = list(worker.run_dir.glob("skw-kept-*"))
    return sorted(p for folder in folders for p in folder.iterdir())


def _settled(worker: WorkerProcess) -> list[Path]:
    """The kept files once every run directory is gone (it is removed after the answer)."""
    deadline = time.monotonic() + 10
    while list(worker.run_dir.glob("skw-run-*")):
        assert time.monotonic() < deadline, "a run directory outlived its answer by 10 s"
        time.sleep(0.02)
    return _kept(worker)


_INODE = (
    "import os\nst = os.stat('../inputs/' + os.listdir('../inputs')[0])\n"
    "inode, size = st.st_ino, st.st_size\ndel os, st\n"
)


def _table_stream(table: pa.Table, source: bytes) -> bytes:
    table = table.replace_schema_metadata(
        {b"strata.arrow.shape": b"table", b"strata.arrow.source": source}
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def _blob_input(name: str, data: bytes, source: bytes) -> tuple[dict[str, str], bytes]:
    """One binary value as an Arrow input that arrives as ``source`` says (a pandas frame is
    copied out of its file as it is read; a pyarrow table still points into it)."""
    table = pa.table({"b": pa.array([data], pa.large_binary())})
    return {"name": name, "format": "arrow/ipc"}, _table_stream(table, source)


_FRAME = b"pandas.DataFrame"
_TABLE = b"pyarrow.Table"
_DIGEST = "import hashlib\ndigest = hashlib.sha256(t['b'][0]).hexdigest()\n"


def test_a_later_input_is_written_over_a_kept_file_and_is_exactly_itself(
    reuse_worker: WorkerProcess,
) -> None:
    first, second = os.urandom(3 * MB), os.urandom(2 * MB + 12345)
    with httpx.Client(base_url=reuse_worker.url, timeout=60) as client:
        bundle = run_ok(client, _DIGEST + _INODE + "del t", [_blob_input("t", first, _FRAME)])
        assert bundle.variables["digest"]["preview"] == hashlib.sha256(first).hexdigest()
        kept = {p.stat().st_ino for p in _settled(reuse_worker)}
        assert bundle.variables["inode"]["preview"] in kept  # its input file was kept
        later = _blob_input("t", second, _FRAME)
        bundle = run_ok(client, _DIGEST + _INODE + "del t", [later])
        assert bundle.variables["digest"]["preview"] == hashlib.sha256(second).hexdigest()
        assert bundle.variables["inode"]["preview"] in kept  # written over a kept file
        assert bundle.variables["size"]["preview"] == len(later[1])  # and cut to its length
        assert len(_settled(reuse_worker)) == len(kept)  # and kept again afterwards
        gauge = [line for line in client.get("/metrics").text.splitlines()
                 if line.startswith("strata_kernel_worker_kept_file_bytes ")]  # fmt: skip
    held = sum(p.stat().st_size for p in _kept(reuse_worker))
    assert held >= 2 * MB and len(gauge) == 1 and float(gauge[0].split()[-1]) == held


_OUTPUT = "import numpy as np, pandas as pd\nout = pd.DataFrame({{'v': {values}}})\ndel np, pd\n"


def test_a_later_output_is_written_over_a_kept_file_and_is_exactly_itself(
    reuse_worker: WorkerProcess,
) -> None:
    with httpx.Client(base_url=reuse_worker.url, timeout=60) as client:
        first = run_ok(client, _OUTPUT.format(values="np.full(3 * 2**20 // 8, -1.0)"))
        kept = {p.stat().st_ino: p.stat().st_size for p in _settled(reuse_worker)}
        assert first.variables["out"]["bytes"] in kept.values()  # its file was kept
        response = execute(client, _OUTPUT.format(values="np.arange(2**18 + 777.0)"))
        bundle = read_bundle(response)
        after = {p.stat().st_ino: p.stat().st_size for p in _settled(reuse_worker)}
    data = bundle.file("out")
    assert after.keys() == kept.keys()  # written over a kept file: no new one
    assert len(data) in after.values()  # and kept again, at its own length
    assert bundle.variables["out"]["bytes"] == len(data)
    table = pa.ipc.open_stream(data).read_all()
    assert table.column("v").to_numpy().tolist() == np.arange(2**18 + 777.0).tolist()
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        member = tar.getmember(bundle.variables["out"]["file"])
    assert member.size == len(data) and member.mode == 0o666 & ~_umask()


def test_an_input_a_cell_still_maps_is_never_written_over(reuse_worker: WorkerProcess) -> None:
    first, second = os.urandom(3 * MB), os.urandom(3 * MB)
    with httpx.Client(base_url=reuse_worker.url, timeout=60) as client:
        # a pyarrow table input points into its file; an attribute of sys keeps it past the request
        keep = "import sys, types\nsys._skw_kept = types.SimpleNamespace(table=t)\n"
        bundle = run_ok(client, _INODE + keep + "del sys, types",
                        [_blob_input("t", first, _TABLE)])  # fmt: skip
        kept = {p.stat().st_ino for p in _settled(reuse_worker)}
        assert bundle.variables["inode"]["preview"] not in kept  # still mapped: not kept
        bundle = run_ok(
            client,
            "import hashlib, sys\n"
            "digest = hashlib.sha256(t.column('b')[0].as_py()).hexdigest()\n"
            "kept = sys.__dict__.pop('_skw_kept').table\n"
            "old = hashlib.sha256(kept.column('b')[0].as_py()).hexdigest()\n"
            "del kept, t, sys, hashlib",
            [_blob_input("t", second, _TABLE)],
        )
    assert bundle.variables["digest"]["preview"] == hashlib.sha256(second).hexdigest()
    assert bundle.variables["old"]["preview"] == hashlib.sha256(first).hexdigest()


def test_a_worker_with_file_reuse_off_keeps_nothing(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    worker = start_worker(tmp_path_factory, "--pool-size", "1", "--file-reuse-bytes", "0")
    try:
        with httpx.Client(base_url=worker.url, timeout=60) as client:
            run_ok(client, _DIGEST + "del t", [_blob_input("t", os.urandom(2 * MB), _FRAME)])
        assert _settled(worker) == []
        assert not list(worker.run_dir.glob("skw-kept-*"))
    finally:
        worker.stop()


# -- pull runs: downloads, outputs and the bundle file ---------------------------------------


def test_a_pull_run_writes_its_input_output_and_bundle_over_kept_files(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    env = {"STRATA_WORKER_ALLOW_LOCAL_HOSTS": "1"}
    worker = start_worker(tmp_path_factory, "--pool-size", "1", env=env)
    store = FakeStore()
    store.start()
    try:
        if not memory_backed(worker.run_dir):
            pytest.skip("files are only kept on a memory filesystem, and there is none here")
        source = (
            "import hashlib, numpy as np, pandas as pd\n"
            "digest = hashlib.sha256(t['b'][0]).hexdigest()\n"
            "out = pd.DataFrame({'v': np.random.default_rng(rows).random(rows)})\n"
            "del t, hashlib, np, pd\n"
        )
        kept: dict[int, int] = {}
        with httpx.Client(base_url=worker.url, timeout=60) as client:
            for run, megabytes in enumerate((3, 2.5)):
                data, rows = os.urandom(int(megabytes * MB)), int(megabytes * MB) // 8
                key = f"reuse-{run}-{os.getpid()}"
                inputs = {
                    "t": ({"content_type": "arrow/ipc"}, _blob_input("t", data, _FRAME)[1]),
                    "rows": ({"content_type": "json/object"}, str(rows).encode()),
                }
                body = manifest(store, key, source, inputs)
                response = client.post("/v1/execute-manifest", json=body)
                assert response.status_code == 200, response.text
                bundle = store.bundle(key)
                variables = bundle.manifest["variables"]
                assert variables["digest"]["preview"] == hashlib.sha256(data).hexdigest()
                table = pa.ipc.open_stream(bundle.members[variables["out"]["file"]]).read_all()
                expected = np.random.default_rng(rows).random(rows)
                assert np.array_equal(table.column("v").to_numpy(), expected)
                after = {p.stat().st_ino: p.stat().st_size for p in _settled(worker)}
                if run == 0:
                    assert len(after) == 3  # the input, the output and the bundle file
                    kept = after
        assert after.keys() == kept.keys()  # all three written over kept files: no new one
        assert sorted(after.values()) != sorted(kept.values())  # each at its own length
    finally:
        store.stop()
        worker.stop()
