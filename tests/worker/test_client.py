"""``kernel_worker.client.session`` and ``strata-kernel-worker run`` against real workers over HTTP."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kernel_worker.client.session import (
    AsyncClient,
    CellError,
    CellResult,
    CellTimeout,
    Client,
    EncodedInput,
    InputEncodingError,
    OutputDecodingError,
    ProtocolError,
    RequestFailed,
    WorkerUnreachable,
    parse_bundle,
)
from tests.conftest import ROOT, WorkerProcess, free_port, start_worker


@pytest.fixture(scope="module")
def client(worker: WorkerProcess) -> Iterator[Client]:
    with Client(worker.url + "/v1/execute", timeout_seconds=60) as c:  # Strata's URL form
        yield c


@pytest.fixture(scope="module")
def queueing_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """One kernel and no inline wait: every request is answered 202 and polled."""
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--queue-wait", "0")
    yield w
    w.stop()


def _health(w: WorkerProcess) -> dict[str, object]:
    body: dict[str, object] = httpx.get(w.url + "/health", timeout=10).json()
    return body


def _cancelled(w: WorkerProcess) -> int:
    pool = _health(w)["pool"]
    assert isinstance(pool, dict)
    return int(pool["retirements"].get("cancelled", 0))


def _busy_kernels(w: WorkerProcess) -> int:
    pool = _health(w)["pool"]
    assert isinstance(pool, dict)
    return int(pool["kernels"].get("busy", 0))


def _wait_until(condition: object, what: str, timeout: float = 15.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


# -- values in, values out ------------------------------------------------------------------


def test_python_values_go_in_and_come_back_decoded(client: Client) -> None:
    frame = pd.DataFrame({"a": [1, 2, 3], "b": [0.5, 1.5, 2.5]})
    table = pa.table({"x": [10, 20]})
    source = (
        "doubled = df * 2\n"
        "total = int(df['a'].sum()) + settings['offset']\n"
        "kinds = [type(df).__name__, type(tbl).__name__, type(tags).__name__, type(arr).__name__]\n"
        "scaled = arr * 3\n"
        "tags = tags | {'new'}\n"
    )
    inputs = {
        "df": frame,
        "tbl": table,
        "settings": {"offset": 100},
        "tags": {"a", "b"},
        "arr": np.arange(6, dtype=np.int32).reshape(2, 3),
    }
    result = client.run(source, inputs).raise_for_error()
    out = result.outputs
    pd.testing.assert_frame_equal(out["doubled"], frame * 2)
    assert out["total"] == 106
    assert out["kinds"] == ["DataFrame", "Table", "set", "ndarray"]
    np.testing.assert_array_equal(out["scaled"], np.arange(6, dtype=np.int32).reshape(2, 3) * 3)
    assert out["tags"] == {"a", "b", "new"}
    assert result.variables["doubled"]["content_type"] == "arrow/ipc"
    assert result.variables["total"]["preview"] == 106
    assert set(out) == {"doubled", "total", "kinds", "scaled", "tags"}
    assert result.duration_seconds is not None and result.round_trip_seconds > 0


def test_console_and_displays(client: Client) -> None:
    source = (
        "import sys\n"
        "import matplotlib.pyplot as plt\n"
        "from IPython.display import Markdown, display\n"
        "print('to stdout')\n"
        "print('to stderr', file=sys.stderr)\n"
        "fig, ax = plt.subplots()\n"
        "ax.plot([1, 3, 2])\n"
        "plt.show()\n"
        "display(Markdown('# A title'))\n"
        "import pandas as pd\n"
        "pd.DataFrame({'col': [1, 2]})"
    )
    result = client.run(source).raise_for_error()
    assert result.stdout == "to stdout\n"
    assert result.stderr == "to stderr\n"
    chart, title, table = result.displays
    assert chart.content_type == "image/png"
    assert isinstance(chart.data, bytes) and chart.data.startswith(b"\x89PNG\r\n\x1a\n")
    assert (title.content_type, title.data) == ("text/markdown", "# A title")
    assert table.content_type == "text/html" and "<table" in str(table.data)
    assert table.output_type == "execute_result"
    assert "text/plain" in table.formats
    bundle = chart._repr_mimebundle_()  # what Jupyter renders inline
    assert isinstance(bundle["image/png"], str) and bundle["image/png"].startswith("iVBOR")


def test_the_readme_example_shows_the_chart_first(worker: WorkerProcess) -> None:
    """The README's client snippet, run as written (its URL pointed at the test worker)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## A Python client and a command line for humans", 1)[1]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    snippet = snippet.replace("http://127.0.0.1:9000", worker.url)
    namespace: dict[str, object] = {"my_dataframe": pd.DataFrame({"a": [1, 2, 3]})}
    exec(compile(snippet, "README.md", "exec"), namespace)
    result = namespace["result"]
    assert isinstance(result, CellResult)
    assert result.outputs["total"] == 6 and result.success
    chart = result.displays[0]
    assert chart.content_type == "image/png"
    assert "bytes>" in repr(chart) and "\\x89PNG" not in repr(chart)  # not the PNG's bytes


def test_a_cell_that_raises_is_a_result(client: Client) -> None:
    result = client.run("print('before')\n1 / 0")
    assert not result.success
    assert (result.error_type, result.error) == ("ZeroDivisionError", "division by zero")
    assert result.traceback is not None and "ZeroDivisionError" in result.traceback
    assert result.stdout == "before\n"
    with pytest.raises(CellError, match="ZeroDivisionError: division by zero") as raised:
        result.raise_for_error()
    assert raised.value.result is result


def test_encoded_outputs_feed_the_next_cell_as_strata_does(client: Client) -> None:
    first = client.run("import pandas as pd\nframe = pd.DataFrame({'v': [1, 2, 3]})")
    forwarded = first.raise_for_error().outputs.encoded("frame")
    assert forwarded.content_type == "arrow/ipc"
    other = client.run("frame = {'v': 10}").raise_for_error().outputs.encoded("frame")
    # Two outputs of the same name from different cells, each under its own input name.
    second = client.run(
        "total = int(src['v'].sum()) + more['v']", {"src": forwarded, "more": other}
    )
    assert second.raise_for_error().outputs["total"] == 16


def test_env_reaches_the_cell(client: Client) -> None:
    result = client.run("import os\nvalue = os.environ['GREETING']", env={"GREETING": "hi"})
    assert result.raise_for_error().outputs["value"] == "hi"


def test_an_output_the_worker_could_not_serialize(client: Client) -> None:
    result = client.run("import threading\nlock = threading.Lock()\nok = 1").raise_for_error()
    assert result.outputs["ok"] == 1
    assert "error" in result.variables["lock"]
    with pytest.raises(OutputDecodingError, match="'lock' was not serialized"):
        result.outputs["lock"]


def test_inputs_that_cannot_be_encoded(client: Client) -> None:
    with pytest.raises(InputEncodingError, match="not a Python identifier"):
        client.run("x = 1", {"not valid": 1})
    with pytest.raises(InputEncodingError, match=r"'lock' .* cannot be encoded"):
        client.run("x = 1", {"lock": threading.Lock()})


# -- what is not a cell result ----------------------------------------------------------------


def test_a_refused_request_raises_with_the_workers_detail(client: Client) -> None:
    with pytest.raises(RequestFailed) as raised:
        client.run("x = 1", env={"BAD=NAME": "v"})
    assert raised.value.status_code == 400
    assert "not a valid variable name" in raised.value.detail


def test_a_timeout_raises_cell_timeout(client: Client) -> None:
    with pytest.raises(CellTimeout) as raised:
        client.run("import time\ntime.sleep(30)", timeout_seconds=0.5)
    assert raised.value.status_code == 408


def test_an_unreachable_worker() -> None:
    with Client(f"http://127.0.0.1:{free_port()}") as c, pytest.raises(WorkerUnreachable):
        c.run("x = 1")


def test_urls_that_are_not_http_are_refused() -> None:
    with pytest.raises(ValueError, match="not an http"):
        Client("ftp://example.com/v1/execute")


def test_health(client: Client) -> None:
    health = client.health()
    assert health["status"] == "healthy"


# -- queued cells (202 + job URL) and cancellation ------------------------------------------------


def test_a_queued_cell_is_polled_to_its_result(queueing_worker: WorkerProcess) -> None:
    with Client(queueing_worker.url) as c:
        assert c.run("x = 21 * 2").raise_for_error().outputs["x"] == 42
        with pytest.raises(CellTimeout) as raised:  # a failed job, read from the poll
            c.run("import time\ntime.sleep(30)", timeout_seconds=0.5)
        assert raised.value.status_code == 408


async def test_async_client_runs_cells_concurrently(worker: WorkerProcess) -> None:
    async with AsyncClient(worker.url) as c:
        results = await asyncio.gather(*(c.run(f"v = {i} * n", {"n": 10}) for i in range(3)))
        assert [r.raise_for_error().outputs["v"] for r in results] == [0, 10, 20]
        assert (await c.health())["status"] == "healthy"


async def test_cancelling_an_async_run_cancels_the_cell(queueing_worker: WorkerProcess) -> None:
    """The run is being polled (no open request), so only the client's cancel can stop it."""
    before = _cancelled(queueing_worker)
    async with AsyncClient(queueing_worker.url) as c:
        task = asyncio.ensure_future(c.run("import time\ntime.sleep(60)", timeout_seconds=90))
        deadline = time.monotonic() + 30
        while _busy_kernels(queueing_worker) != 1:  # running on a kernel, not just queued
            assert time.monotonic() < deadline, "the cell never started"
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    _wait_until(lambda: _cancelled(queueing_worker) == before + 1, "the cell was not cancelled")
    assert _health(queueing_worker)["active_executions"] == 0


# -- the bundle alone ---------------------------------------------------------------------------


def _tar(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_reference_worker_bundle_without_jupyter_displays() -> None:
    """The reference worker sends a plain tar with ``displays`` only: PNG and markdown."""
    manifest = {
        "success": True,
        "variables": {"x": {"content_type": "json/object", "file": "files/x.json"}},
        "displays": [
            {"content_type": "image/png", "file": "files/__display__0.png"},
            {"content_type": "text/markdown", "markdown_text": "# hi", "file": None},
        ],
        "stdout_file": "stdout.txt",
        "stderr_file": "stderr.txt",
    }
    body = _tar(
        {
            "stdout.txt": b"out\n",
            "stderr.txt": b"",
            "files/x.json": b"[1, 2]",
            "files/__display__0.png": b"\x89PNG fake",
            "manifest.json": json.dumps(manifest).encode(),
        }
    )
    result = parse_bundle(body, 0.1)
    assert result.success and result.stdout == "out\n" and result.outputs["x"] == [1, 2]
    assert [(d.content_type, d.data) for d in result.displays] == [
        ("image/png", b"\x89PNG fake"),
        ("text/markdown", "# hi"),
    ]
    assert result.duration_seconds is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not a tar", "not a readable tar"),
        (_tar({"stdout.txt": b""}), "no manifest.json"),
        (_tar({"manifest.json": b"[1]"}), "not a JSON object"),
    ],
)
def test_bundles_that_are_not_bundles(body: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        parse_bundle(body, 0.1)


def test_encoded_input_defaults_its_file_name(client: Client) -> None:
    raw = EncodedInput("json/object", b'{"k": [1, 2]}')
    assert client.run("n = len(Cfg['k'])", {"Cfg": raw}).raise_for_error().outputs["n"] == 2


# -- strata-kernel-worker run ------------------------------------------------------------------


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernel_worker", "run", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_run_command_prints_the_console_and_saves_results(
    worker: WorkerProcess, tmp_path: Path
) -> None:
    pq.write_table(pa.table({"a": [1, 2, 3]}), tmp_path / "data.parquet")
    (tmp_path / "config.json").write_text('{"factor": 10}')
    (tmp_path / "notes.txt").write_text("hello")
    cell = tmp_path / "cell.py"
    cell.write_text(
        "import sys\nimport matplotlib.pyplot as plt\n"
        "total = int(df['a'].sum()) * config['factor']\n"
        "kind = type(df).__name__\n"
        "text = notes.read_text()\n"
        "print('total is', total)\nprint('careful', file=sys.stderr)\n"
        "plt.plot(df['a'])\nplt.show()\n"
    )
    out = tmp_path / "out"
    proc = _cli(
        str(cell), "--input", f"df={tmp_path / 'data.parquet'}", "-i",
        f"config={tmp_path / 'config.json'}", "-i", f"notes={tmp_path / 'notes.txt'}",
        "--url", worker.url, "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "total is 60\n"
    # (a slow machine may show a status line first: "[running: 5s]")
    said = [line for line in proc.stderr.splitlines() if not line.startswith("[")]
    assert said[0] == "careful"
    assert json.loads((out / "files" / "total.json").read_text()) == 60
    assert json.loads((out / "files" / "kind.json").read_text()) == "DataFrame"
    assert json.loads((out / "files" / "text.json").read_text()) == "hello"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["success"] is True
    (png,) = [d["file"] for d in manifest["display"] if d["content_type"] == "image/png"]
    assert (out / png).read_bytes().startswith(b"\x89PNG")  # where the manifest says
    assert (out / "stdout.txt").read_text() == "total is 60\n"


def test_run_command_exits_non_zero_on_a_cell_error(worker: WorkerProcess) -> None:
    proc = _cli("-", "--url", worker.url + "/v1/execute", stdin="print('hi')\nraise KeyError('k')")
    assert proc.returncode == 1
    assert proc.stdout == "hi\n"
    assert "KeyError" in proc.stderr


def test_run_command_reports_worker_and_usage_failures(tmp_path: Path) -> None:
    cell = tmp_path / "cell.py"
    cell.write_text("x = 1")
    unreachable = _cli(str(cell), "--url", f"http://127.0.0.1:{free_port()}")
    assert unreachable.returncode == 3 and "run:" in unreachable.stderr
    assert _cli(str(cell), "--input", "no-equals-sign").returncode == 2
    assert _cli(str(tmp_path / "missing.py")).returncode == 2
    refused = {  # each a one-line usage error (status 2) before anything is sent
        "--timeout 0": _cli(str(cell), "--timeout", "0"),
        "missing input": _cli(str(cell), "--input", f"df={tmp_path / 'missing.parquet'}"),
        "folder input": _cli(str(cell), "--input", f"df={tmp_path}"),
        "unwritable --out": _cli(str(cell), "--out", "/proc/no-such-dir/out"),
    }
    for what, proc in refused.items():
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (what, proc.stderr)
    assert "no such file" in refused["missing input"].stderr
    assert "is a folder" in refused["folder input"].stderr
