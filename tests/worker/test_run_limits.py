"""The caps on what one run may unpack, display and return, through real HTTP and kernels.

A folder input that unpacks past its caps fails the cell naming the cap; a display over the
display caps is dropped with a marker in both display views; a large display is stored once
and never held by the worker; an output folder returns at most its file cap, and says so.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import WorkerProcess, start_worker
from tests.wire import Bundle, execute, read_bundle, run_ok

MIB = 1024 * 1024
INPUT_CAP = 64 * MIB  # the folder-input byte cap follows it by default


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    w = start_worker(
        tmp_path_factory, "--pool-size", "1", "--max-folder-input-entries", "1000",
        "--max-display-bytes", "8M", "--max-run-display-bytes", "12M",
        "--max-output-dir-files", "50",
        env={"STRATA_WORKER_MAX_INPUT_BYTES": str(INPUT_CAP)},
    )  # fmt: skip
    yield w
    w.stop()


@pytest.fixture
def client(limited: WorkerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=limited.url, timeout=120) as c:
        yield c
        # the kernel that met the cap serves the next request as usual
        assert run_ok(c, "after = 1 + 1").variables["after"]["preview"] == 2


def test_health_reports_the_caps(client: httpx.Client) -> None:
    limits = client.get("/health").json()["capabilities"]["limits"]
    assert limits == {
        "max_input_bytes": INPUT_CAP,
        "console_cap": 16 * MIB,  # the default
        "max_folder_input_bytes": INPUT_CAP,
        "max_folder_input_entries": 1000,
        "max_display_bytes": 8 * MIB,
        "max_run_display_bytes": 12 * MIB,
        "max_output_dir_files": 50,
    }


# ---- folder inputs ----------------------------------------------------------------------------


class _Zeros:
    """A file object of ``size`` zero bytes, read without holding them."""

    def __init__(self, size: int) -> None:
        self.left, self.block = size, bytes(MIB)

    def read(self, n: int = -1) -> bytes:
        n = min(self.left, MIB if n < 0 else n)
        self.left -= n
        return self.block[:n]


@pytest.fixture(scope="module")
def zeros_bomb() -> bytes:
    """About 1 MB of gzip that unpacks to a 1 GiB file of zeros."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=9, copybufsize=MIB) as tar:
        info = tarfile.TarInfo("zeros.bin")
        info.size = 1024**3
        tar.addfile(info, _Zeros(info.size))
    return out.getvalue()


@pytest.fixture(scope="module")
def entries_bomb() -> bytes:
    """About 0.6 MB of gzip that unpacks to 100,000 empty files."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=9) as tar:
        for i in range(100_000):
            tar.addfile(tarfile.TarInfo(f"f{i}"))
    return out.getvalue()


def _folder_error(client: httpx.Client, archive: bytes) -> str:
    bundle = read_bundle(execute(
        client, "n = len(list(folder.iterdir()))",
        [({"name": "folder", "format": "dir/tar", "file": "folder.dir.tar"}, archive)],
    ))  # fmt: skip
    assert bundle.manifest["success"] is False, bundle.manifest
    assert bundle.manifest["variables"] == {}
    error = bundle.manifest["error"]
    assert isinstance(error, str) and error.startswith("Error deserializing folder: "), error
    return error


def test_a_gzip_bomb_folder_input_stops_at_the_input_cap(
    client: httpx.Client, zeros_bomb: bytes
) -> None:
    assert len(zeros_bomb) < 2 * MIB
    error = _folder_error(client, zeros_bomb)
    assert "more than 64 MiB, the cap on a folder input (--max-folder-input-bytes" in error


def test_a_folder_input_of_100000_empty_files_stops_at_the_entry_cap(
    client: httpx.Client, entries_bomb: bytes
) -> None:
    assert len(entries_bomb) < MIB
    error = _folder_error(client, entries_bomb)
    assert (
        "more than 1,000 entries, the cap on a folder input (--max-folder-input-entries)" in error
    )


def test_nothing_past_the_cap_is_written(client: httpx.Client) -> None:
    """The member that passes the cap is refused from its header: its data is never read (the
    archive ends right after that header, which would fail as truncated had it been)."""
    first = tarfile.TarInfo("first.bin")
    first.size = 1000
    huge = tarfile.TarInfo("huge.bin")
    huge.size = 1024**3
    head = first.tobuf(tarfile.PAX_FORMAT) + b"1" * 1000 + b"\0" * 24
    error = _folder_error(client, head + huge.tobuf(tarfile.PAX_FORMAT) + b"\0" * 1024)
    assert "'huge.bin' passes it" in error and "--max-folder-input-bytes" in error
    within = run_ok(client, "n = (folder / 'first.bin').stat().st_size", [(
        {"name": "folder", "format": "dir/tar", "file": "folder.dir.tar"}, head + b"\0" * 1024
    )])  # fmt: skip
    assert within.variables["n"]["preview"] == 1000


# ---- displays ---------------------------------------------------------------------------------


def _image_cell(*sizes_mib: float, extra: str = "") -> str:
    shows = "".join(
        f"display(Image(data=b'\\x89PNG\\r\\n\\x1a\\n' + os.urandom({int(s * MIB)}), format='png'))\n"
        for s in sizes_mib
    )
    return f"import os\nfrom IPython.display import Image\n{shows}{extra}x = 1\n"


def _largest_member(bundle: Bundle) -> int:
    return max(len(data) for data in bundle.members.values())


def test_a_display_over_the_cap_is_dropped_with_a_marker(client: httpx.Client) -> None:
    response = execute(client, _image_cell(10))
    bundle = read_bundle(response)
    assert bundle.manifest["success"] is True
    assert len(response.content) < 64 * 1024 and _largest_member(bundle) < 64 * 1024
    [reference] = bundle.manifest["displays"]
    assert reference["type"] == "DisplayTooLarge"
    assert reference["dropped"] == {
        "bytes": 10 * MIB + 8,
        "cap": 8 * MIB,
        "limit": "--max-display-bytes",
    }
    assert reference["error"] == (
        "Display 0 was dropped: it holds 10 MiB, over the 8 MiB cap on one display "
        "(--max-display-bytes)"
    )
    [jupyter] = bundle.manifest["display"]
    assert (
        jupyter["content_type"] == "text/plain"
        and jupyter["dropped"]["limit"] == "--max-display-bytes"
    )
    note = bundle.members[jupyter["file"]].decode()
    assert note.startswith("[display dropped: it holds 10 MiB") and "(--max-display-bytes)]" in note
    assert bundle.manifest["variables"]["_"] == reference


def test_the_run_cap_counts_the_displays_a_run_keeps(client: httpx.Client) -> None:
    bundle = run_ok(client, _image_cell(5, 5, 5))
    kept = [d for d in bundle.manifest["displays"] if "error" not in d]
    assert len(kept) == 2
    dropped = bundle.manifest["displays"][2]
    assert (
        dropped["dropped"]["limit"] == "--max-run-display-bytes"
        and dropped["dropped"]["cap"] == 12 * MIB
    )
    jupyter = {
        d["index"]: d for d in bundle.manifest["display"] if d["content_type"] != "text/plain"
    }
    assert sorted(jupyter) == [0, 1]
    notes = [d for d in bundle.manifest["display"] if d.get("dropped")]
    assert [d["index"] for d in notes] == [2]
    assert notes[0]["dropped"]["limit"] == "--max-run-display-bytes"
    # what a cell replaces or clears no longer counts: five 5 MiB images, one kept each time
    updates = (
        "import os\nfrom IPython.display import Image, clear_output\n"
        "def image():\n    return Image(data=b'\\x89PNG\\r\\n\\x1a\\n' + os.urandom(5 * 2**20), format='png')\n"
        "handle = display(image(), display_id=True)\n"
        "for _ in range(4):\n    handle.update(image())\n"
        "for _ in range(5):\n    clear_output(wait=True)\n    display(image())\n"
    )
    bundle = run_ok(client, updates)
    assert [d.get("content_type") for d in bundle.manifest["displays"]] == ["image/png"]
    pngs = [d for d in bundle.manifest["display"] if d["content_type"] == "image/png"]
    assert [d["bytes"] for d in pngs] == [5 * MIB + 8] and not any(
        d.get("dropped") for d in bundle.manifest["display"]
    )


def test_a_display_sent_around_the_agent_is_cut_to_one_message(client: httpx.Client) -> None:
    """A cell can send a display message itself; the kernel cuts one over the most a
    message may hold (the worker's 512 KiB) to a note of what it held, and the run goes on."""
    source = (
        "ip = get_ipython()\nkernel = ip.kernel\n"
        "kernel.session.send(kernel.iopub_socket, 'display_data', "
        "{'data': {'text/plain': 'y' * (9 * 2**20)}, 'metadata': {}, 'transient': {}}, "
        "parent=kernel.get_parent('shell'), ident=b'display_data')\n"
        "x = 1\n"
    )
    bundle = run_ok(client, source)
    [entry] = bundle.manifest["display"]
    text = bundle.members[entry["file"]].decode()
    assert text.startswith("[display dropped: text/plain (9437186 bytes);"), text
    assert "one message may hold at most 524288 bytes" in text
    assert "lost" not in bundle.stderr()


def test_a_large_display_is_stored_once_and_never_held_by_the_worker(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    size = 96 * MIB
    w = start_worker(
        tmp_path_factory, "--pool-size", "1", "--max-display-bytes", "128M",
        "--max-run-display-bytes", "128M", "--bundle-compresslevel", "0",
    )  # fmt: skip
    try:
        process = psutil.Process(w.proc.pid)
        with httpx.Client(base_url=w.url, timeout=240) as c:
            run_ok(c, _image_cell(0.5))  # everything a display needs is imported and warm
            idle = process.memory_info().rss
            _reset_peak_rss(w.proc.pid)
            response = execute(c, _image_cell(size / MIB), timeout_seconds=200)
            growth = _peak_rss(w.proc.pid) - idle
        bundle = read_bundle(response)
        [reference] = bundle.manifest["displays"]
        [jupyter] = [d for d in bundle.manifest["display"] if d["content_type"] == "image/png"]
        assert reference["file"] == jupyter["file"] == "files/__display__0.png"
        assert jupyter["bytes"] == size + 8
        assert size < len(response.content) < size + MIB  # the image's bytes, once
        assert growth < 32 * MIB, f"the worker grew by {growth / MIB:.0f} MiB for the display"
    finally:
        w.stop()


def _reset_peak_rss(pid: int) -> None:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM starts again from VmRSS
    except OSError:
        pytest.skip("the peak RSS of the worker cannot be reset here")


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no VmHWM in /proc")


# ---- output folders ---------------------------------------------------------------------------


def test_output_folders_return_at_most_the_file_cap_and_say_so(client: httpx.Client) -> None:
    source = (
        "# @output_dir first\n# @output_dir second\n"
        "for i in range(30):\n    (first / f'{i}.txt').write_text(str(i))\n"
        "(second / 'sub').mkdir()\n"
        "for i in range(40):\n    (second / 'sub' / f'{i}.txt').write_text(str(i))\n"
    )
    bundle = run_ok(client, source)
    listed = bundle.manifest["output_dirs"]
    assert len(listed["first"]) == 30 and len(listed["second"]) == 20
    assert len([m for m in bundle.members if m.startswith("dirs/")]) == 50
    assert bundle.manifest["output_dirs_truncated"] == {
        "folders": ["second"], "max_files": 50, "limit": "--max-output-dir-files",
    }  # fmt: skip
    assert "hold more than 50 files in all" in bundle.stderr()
    assert "(the cap on a run's output-folder files, --max-output-dir-files)" in bundle.stderr()
    exact = run_ok(
        client, "# @output_dir out\nfor i in range(50):\n    (out / f'{i}').write_text('x')\n"
    )
    assert len(exact.manifest["output_dirs"]["out"]) == 50
    assert "output_dirs_truncated" not in exact.manifest and exact.stderr() == ""
