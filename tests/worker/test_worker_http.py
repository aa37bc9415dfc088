"""The push path over real HTTP against a real worker process and real kernels."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import httpx
import pandas as pd
import pyarrow as pa
import pytest

from tests.conftest import ROOT, WorkerProcess, start_worker
from tests.wire import (
    Background,
    execute,
    first_block_stored,
    read_bundle,
    run_ok,
    running_cell,
    v1_metadata,
    wait_active,
    wait_running,
)


@pytest.fixture(scope="module")
def client(worker: WorkerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=worker.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def solo(solo_worker: WorkerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=solo_worker.url, timeout=120) as c:
        yield c


def arrow_stream(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def envelope(value: object) -> bytes:
    return pickle.dumps(
        {
            "__strata_object_codec__": "strata.notebook.object_codec.v1",
            "codec": "cloudpickle",
            "payload": cloudpickle.dumps(value, protocol=5),
        },
        protocol=5,
    )


# -- health ---------------------------------------------------------------------------------------


def test_health_reports_capabilities_and_pool(client: httpx.Client) -> None:
    body = client.get("/health").json()
    assert body["status"] == "healthy"
    assert body["capabilities"]["protocol_versions"] == ["v1"]
    assert "notebook_cell@v1" in body["capabilities"]["transform_refs"]
    features = body["capabilities"]["features"]
    assert features["notebook_protocol_version"] == "notebook-cell-v1"
    assert features["output_format"] == "notebook-output-bundle@v1"
    assert features["pull_model"] is True
    assert features["cancel"] is True and features["output_dirs"] is True
    assert body["max_concurrent"] == 2
    assert body["hardware"]["cpus"] >= 1
    assert sum(body["pool"]["kernels"].values()) >= 2
    assert isinstance(body["uptime_seconds"], float)


@pytest.mark.parametrize("path", ["/health", "/ready"])
def test_probes_answer_head_too(client: httpx.Client, path: str) -> None:
    """Load balancers and uptime checks probe with HEAD: the status, no body."""
    response = client.head(path)
    assert response.status_code == 200 and response.content == b""
    assert response.headers["content-type"] == "application/json"
    schema = client.get("/openapi.json").json()  # HEAD stays out: no operation id twice
    ids = [op["operationId"] for item in schema["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids)) and "head" not in schema["paths"][path]


# -- the bundle -----------------------------------------------------------------------------------


def test_simple_cell_bundle_satisfies_both_formats(client: httpx.Client) -> None:
    response = execute(client, "x = 1 + 1\nprint('hi')\nimport math\nBig = 5\n_p = 3\nx")
    assert response.headers["x-strata-executor-protocol"] == "v1"
    assert response.headers["x-strata-notebook-executor-protocol"] == "notebook-cell-v1"
    assert response.headers["x-strata-output-format"] == "notebook-output-bundle@v1"
    assert response.content[:2] == b"\x1f\x8b"  # gzip
    bundle = read_bundle(response)
    m = bundle.manifest
    assert m["schema_version"] == "notebook-output-bundle@v1"
    assert m["protocol_version"] == "notebook-output-bundle@v1"
    assert m["executor_ref"] == "notebook_cell@v1"
    assert m["success"] is True and m["error"] is None
    assert set(m["variables"]) == {"x", "math", "Big", "_"}
    assert m["variables"]["x"] == {
        "bytes": 1, "content_type": "json/object", "file": "files/x.json", "preview": 2,
    }  # fmt: skip
    assert m["variables"]["Big"]["file"] == "files/Big-f69fd263.json"
    assert m["variables"]["math"]["content_type"] == "module/import"
    assert m["variables"]["_"]["file"] == "files/x.json"  # the display reuses x's file
    assert bundle.stdout() == "hi\n"
    assert json.loads(bundle.members["console.json"]) == {"stdout": "hi\n", "stderr": ""}
    outputs = {o["name"]: o["file"] for o in m["outputs"]}
    assert outputs.keys() >= {"x", "math", "Big"}
    assert outputs["x"] == "files/x.json"  # the seed's index names the member with the bytes
    assert m["build_env"].startswith("cpython-")
    assert isinstance(m["duration_ms"], int)
    assert m["console"] == "console.json"
    assert m["stdout_file"] == "stdout.txt" and m["stderr_file"] == "stderr.txt"


def test_notebook_execute_flat_envelope(client: httpx.Client) -> None:
    meta = {
        "protocol_version": "notebook-cell-v1",
        "source": "y = value * 3",
        "inputs": {"value": {"content_type": "json/object", "file": "value.json"}},
    }
    response = execute(
        client, "", [({"name": "value", "file": "value.json"}, b"14")],
        route="/v1/notebook-execute", metadata=meta,
    )  # fmt: skip
    assert read_bundle(response).variables["y"]["preview"] == 42


# -- inputs ---------------------------------------------------------------------------------------


def test_arrow_input_with_pandas_metadata(client: httpx.Client) -> None:
    df = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    table = pa.Table.from_pandas(df)
    table = table.replace_schema_metadata(
        {**table.schema.metadata, b"strata.arrow.shape": b"table",
         b"strata.arrow.source": b"pandas.DataFrame"}
    )  # fmt: skip
    bundle = run_ok(
        client,
        "total = int(df['a'].sum())\nkind = type(df).__name__\nfirst = df['b'][0]",
        [({"name": "df", "format": "arrow/ipc", "file": "df.arrow"}, arrow_stream(table))],
    )
    assert bundle.variables["total"]["preview"] == 6
    assert bundle.variables["kind"]["preview"] == "DataFrame"
    assert bundle.variables["first"]["preview"] == "x"
    assert "df" not in bundle.variables  # read, not rebound


def test_plain_arrow_stream_arrives_as_dataframe(client: httpx.Client) -> None:
    data = arrow_stream(pa.table({"a": [1, 2, 3]}))
    bundle = run_ok(
        client, "kind = type(t).__name__", [({"name": "t", "format": "arrow/ipc"}, data)]
    )
    assert bundle.variables["kind"]["preview"] == "DataFrame"


def test_json_pickle_markdown_and_module_inputs(client: httpx.Client) -> None:
    inputs = [
        ({"name": "cfg", "format": "json/object", "file": "cfg.json"}, b'{"k": [1, 2]}'),
        ({"name": "obj", "format": "pickle/object", "file": "obj.pickle"}, envelope({1, 2, 3})),
        ({"name": "raw", "format": "pickle/object", "file": "raw.pickle"}, pickle.dumps(b"abc")),
        ({"name": "md", "format": "text/markdown", "file": "md.md"}, b"# Title"),
        ({"name": "m", "format": "module/import", "file": "m.module.json"},
         b'{"module_name": "statistics"}'),
    ]  # fmt: skip
    source = "out = [cfg['k'][1], sorted(obj), raw.decode(), md, m.__name__, m.mean([1, 3])]"
    bundle = run_ok(client, source, inputs)
    assert bundle.variables["out"]["preview"] == [2, [1, 2, 3], "abc", "# Title", "statistics", 2]


def test_file_path_and_dir_tar_inputs(client: httpx.Client) -> None:
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        data = b"hello from a folder"
        info = tarfile.TarInfo("sub/note.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    inputs = [
        ({"name": "data", "format": "file/path", "file": "__fetch_0_data.csv"}, b"a,b\n1,2\n"),
        ({"name": "folder", "format": "dir/tar", "file": "folder.dir.tar"}, archive.getvalue()),
    ]
    source = (
        "csv = data.read_text()\nname = data.name\n"
        "note = (folder / 'sub' / 'note.txt').read_text()\nkind = type(folder).__name__"
    )
    bundle = run_ok(client, source, inputs)
    assert bundle.variables["csv"]["preview"] == "a,b\n1,2\n"
    assert bundle.variables["name"]["preview"] == "__fetch_0_data.csv"
    assert bundle.variables["note"]["preview"] == "hello from a folder"
    assert bundle.variables["kind"]["preview"].endswith("Path")


def test_unsafe_dir_tar_is_refused_as_a_cell_error(client: httpx.Client) -> None:
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    bundle = read_bundle(execute(
        client, "x = 1", [({"name": "folder", "format": "dir/tar"}, archive.getvalue())]
    ))  # fmt: skip
    assert bundle.manifest["success"] is False
    assert "folder" in bundle.manifest["error"]


def test_module_cell_input_with_injected_value(client: httpx.Client) -> None:
    descriptor = {
        "module_name": "nb_test_cell_area_0123456789ab",
        "symbol_name": "area",
        "kind": "function",
        "source": "def area(r):\n    return round(PI * r * r, 5)\n",
        "provenance_hash": "abc",
    }
    inputs = [(
        {"name": "area", "format": "module/cell", "file": "area.cell_module.json",
         "injected": {"PI": {"content_type": "json/object", "file": "PI.json"}}},
        json.dumps(descriptor).encode(),
    ), ({"name": "PI", "file": "PI.json", "format": "json/object"}, b"3.14159")]  # fmt: skip
    meta = v1_metadata("result = area(2)", [inputs[0][0]])
    bundle = read_bundle(execute(client, "", inputs, metadata=meta))
    assert bundle.variables["result"]["preview"] == 12.56636


def test_corrupt_input_is_a_clear_cell_error(client: httpx.Client) -> None:
    bundle = read_bundle(execute(
        client, "y = df", [({"name": "df", "format": "arrow/ipc"}, b"not arrow at all")]
    ))  # fmt: skip
    assert bundle.manifest["success"] is False
    assert bundle.manifest["error"].startswith("Error deserializing df:")


def test_an_r_only_input_fails_the_cell_naming_its_variable(client: httpx.Client) -> None:
    """The reference's structured error: no "Error deserializing" prefix, no staged path."""
    bundle = read_bundle(execute(
        client, "y = model", [({"name": "model", "format": "application/x-r-rds"}, b"X\n")]
    ))  # fmt: skip
    assert bundle.manifest["success"] is False
    error = bundle.manifest["error"]
    assert error.startswith("Cannot consume R-only artifact (variable 'model') from Python:")
    assert bundle.manifest["traceback"].splitlines()[-1].endswith(f"RArtifactError: {error}")


def test_tables_are_bound_as_their_uri_and_snapshot(solo: httpx.Client) -> None:
    tables = {
        "events": {"uri": "strata://table/events", "snapshot_id": 42},
        "users": {"uri": "s3://bucket/users", "snapshot_id": None},
    }
    bundle = run_ok(solo, (
        "seen = [events, events_snapshot, users, users_snapshot]\nusers = users.upper()"
    ), tables=tables)  # fmt: skip
    assert bundle.variables["seen"]["preview"] == [
        "strata://table/events",
        42,
        "s3://bucket/users",
        None,
    ]
    # bound before the cell ran: only a name the cell rebinds is an output
    assert set(bundle.variables) == {"seen", "users"}
    assert bundle.variables["users"]["preview"] == "S3://BUCKET/USERS"
    after = run_ok(solo, "left = [n for n in ('events', 'events_snapshot') if n in dir()]")
    assert after.variables["left"]["preview"] == []


def minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[7])


def test_uploads_reuse_the_workers_memory(client: httpx.Client, worker: WorkerProcess) -> None:
    """An 8 MB body passes through the worker without 2,000 fresh pages (page faults) a time."""
    table = pa.table({"x": pa.array(range(1_000_000), pa.float64())})
    payload = arrow_stream(table)
    inputs = [({"name": "df", "format": "arrow/ipc"}, payload)]
    run_ok(client, "n = len(df)", inputs)  # warm: the heap grows once
    before = minor_faults(worker.proc.pid)
    for _ in range(2):
        assert run_ok(client, "n = len(df)", inputs).variables["n"]["preview"] == 1_000_000
    faults = minor_faults(worker.proc.pid) - before
    pages = 2 * len(payload) // 4096
    assert faults < pages // 4, f"{faults} page faults for {pages} pages uploaded"


# -- outputs and displays --------------------------------------------------------------------------


def test_output_kinds(client: httpx.Client) -> None:
    source = (
        "import numpy as np, pandas as pd, threading\n"
        "frame = pd.DataFrame({'a': range(30)})\n"
        "arr = np.arange(6).reshape(2, 3)\n"
        "pair = (1, 2)\n"
        "def f(v):\n    return v + 1\n"
        "lock = threading.Lock()\n"
        "nothing = None\n"
    )
    v = run_ok(client, source).variables
    assert v["frame"]["content_type"] == "arrow/ipc" and v["frame"]["rows"] == 30
    assert len(v["frame"]["preview"]) == 20
    assert v["arr"]["content_type"] == "arrow/ipc"
    assert v["arr"]["preview"] == "ndarray shape=(2, 3) dtype=int64"
    assert v["pair"]["content_type"] == "pickle/object" and v["pair"]["codec"] == "cloudpickle"
    assert v["f"]["content_type"] == "pickle/object"
    assert set(v["lock"]) == {"error", "type"}
    assert v["nothing"] == {"bytes": 4, "content_type": "json/object", "file": "files/nothing.json",
                            "preview": None}  # fmt: skip
    assert v["np"]["content_type"] == "module/import"


def test_arrow_output_round_trips(client: httpx.Client) -> None:
    bundle = run_ok(client, "import pandas as pd\nout = pd.DataFrame({'q': [1.5, 2.5]})")
    table = pa.ipc.open_stream(bundle.file("out")).read_all()
    assert table.column("q").to_pylist() == [1.5, 2.5]
    assert table.schema.metadata[b"strata.arrow.shape"] == b"table"


def test_reference_and_jupyter_displays(client: httpx.Client) -> None:
    source = (
        "import matplotlib.pyplot as plt\n"
        "from IPython.display import HTML\n"
        "display(Markdown('# Title'))\n"
        "display(HTML('<b>bold</b>'))\n"
        "plt.plot([1, 2, 3])\n"
        "plt.show()\n"
        "plt.figure(); plt.plot([3, 2])\n"  # never shown: Jupyter flushes it, the reference not
        "41 + 1\n"
    )
    m = run_ok(client, source).manifest
    kinds = [d["content_type"] for d in m["displays"]]
    assert kinds[0] == "text/markdown" and m["displays"][0]["markdown_text"] == "# Title"
    assert "image/png" in kinds
    assert m["displays"][-1]["preview"] == 42
    assert m["variables"]["_"]["preview"] == 42
    assert kinds.count("image/png") == 1
    png = next(d for d in m["displays"] if d["content_type"] == "image/png")
    assert png["inline_data_url"].startswith("data:image/png;base64,")
    jupyter = {(d["index"], d["content_type"]) for d in m["display"]}
    types = {t for _, t in jupyter}
    assert {"text/markdown", "text/html", "image/png", "text/plain"} <= types
    assert sum(1 for _, t in jupyter if t == "image/png") == 2  # shown + flushed, each once
    # the shown figure's PNG is one file in both views, stored once (under files/)
    assert [d["file"] for d in m["display"] if d["file"] == png["file"]] == [png["file"]]
    for entry in m["display"]:
        assert entry["file"].startswith("display/") or entry["file"] == png["file"]


def test_console_includes_stderr_and_subprocess_output(client: httpx.Client) -> None:
    source = (
        "import sys, os, warnings\n"
        "print('out')\nprint('err', file=sys.stderr)\n"
        "os.system('echo from-a-child')\n"
        "warnings.warn('careful')\n"
    )
    bundle = run_ok(client, source)
    assert "out" in bundle.stdout() and "from-a-child" in bundle.stdout()
    assert "err" in bundle.stderr() and "careful" in bundle.stderr()


def test_magics_work(client: httpx.Client) -> None:
    bundle = run_ok(client, "%config InlineBackend.figure_format = 'png'\nvalue = 2 ** 10")
    assert bundle.variables["value"]["preview"] == 1024


# -- cell failures --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "error", "etype"),
    [
        (
            "print('before')\nraise RuntimeError('model not loaded')",
            "model not loaded",
            "RuntimeError",
        ),
        ("x = (", None, "SyntaxError"),
        (
            "import no_such_module_here",
            "No module named 'no_such_module_here'",
            "ModuleNotFoundError",
        ),
        ("import sys\nsys.exit(3)", "3", "SystemExit"),
        ("raise KeyboardInterrupt", "", "KeyboardInterrupt"),
        ("exit()", "", "SystemExit"),
        ("quit(2)", "2", "SystemExit"),
    ],
)
def test_cell_errors_are_200_with_success_false(
    client: httpx.Client, source: str, error: str | None, etype: str
) -> None:
    bundle = read_bundle(execute(client, source))
    m = bundle.manifest
    assert m["success"] is False
    assert m["variables"] == {}
    if error is not None:
        assert m["error"] == error
    assert "\x1b[" not in (m["traceback"] or "")
    failure = json.loads(bundle.members["error.json"])
    assert failure["type"] == etype and failure["exit_code"] == 1
    if "before" in source:
        assert bundle.stdout() == "before\n"
        assert "raise RuntimeError" in m["traceback"]


# -- statuses --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "detail"),
    [
        (b"{not json", "Invalid metadata"),
        (json.dumps(v1_metadata("x=1") | {"protocol_version": "v9"}).encode(),
         "Unsupported protocol version: v9. Expected: v1"),
        (json.dumps({"transform": {"ref": "other@v1", "params": {}}}).encode(),
         "Unsupported transform: other@v1. Expected: notebook_cell@v1"),
        (json.dumps(v1_metadata("x=1", [{"name": "a", "format": "video/mp4"}])).encode(),
         "video/mp4"),
        (json.dumps(v1_metadata("x=1", [{"name": "a"}])).encode(), "Missing uploaded input file: a"),
        (json.dumps(v1_metadata("x=1", [{"name": "../a"}])).encode(), "../a"),
        (json.dumps(v1_metadata("x=1", timeout_seconds="soon")).encode(), "timeout_seconds"),
    ],
)  # fmt: skip
def test_bad_requests_are_400_with_detail(
    client: httpx.Client, metadata: bytes, detail: str
) -> None:
    files = {"metadata": ("metadata.json", metadata, "application/json")}
    response = client.post("/v1/execute", files=files)
    assert response.status_code == 400, response.text
    assert detail in response.json()["detail"]


def test_missing_metadata_and_non_multipart(client: httpx.Client) -> None:
    response = client.post(
        "/v1/execute", data={"metadata": "{}"}, files={"x": ("x.bin", b"1", "text/plain")}
    )
    assert response.status_code == 400
    assert response.json()["detail"] == "Missing metadata"
    response = client.post("/v1/execute", json={"source": "x=1"})
    assert response.status_code == 400


def test_timeout_is_408_and_the_worker_recovers(client: httpx.Client) -> None:
    started = time.monotonic()
    response = execute(client, "import time\ntime.sleep(60)", timeout_seconds=1)
    assert response.status_code == 408
    assert time.monotonic() - started < 10
    body = response.json()
    assert body["detail"].startswith("Cell execution timed out after 1s. To give it longer")
    assert "# @timeout <seconds>" in body["detail"] and body["success"] is False
    assert run_ok(client, "ok = True").variables["ok"]["preview"] is True


def test_kernel_death_is_502_and_the_worker_keeps_serving(client: httpx.Client) -> None:
    response = execute(client, "import os\nos._exit(7)")
    assert response.status_code == 502
    assert "died" in response.json()["detail"]
    assert run_ok(client, "ok = 1").variables["ok"]["preview"] == 1


# -- isolation -------------------------------------------------------------------------------------


def test_consecutive_requests_on_one_kernel_are_isolated(solo: httpx.Client) -> None:
    first = run_ok(solo, (
        "import os, sys\nsecret = 'first'\nos.environ['FROM_FIRST'] = '1'\n"
        "sys.path.append('/first')\nseen = os.environ.get('REQ_ENV')\ncwd = os.getcwd()"
    ), env={"REQ_ENV": "only-here"})  # fmt: skip
    assert first.variables["seen"]["preview"] == "only-here"
    second = run_ok(solo, (
        "import os, sys\n"
        "state = ['secret' in dir(), os.environ.get('FROM_FIRST'), os.environ.get('REQ_ENV'),\n"
        "         '/first' in sys.path]\ncwd = os.getcwd()"
    ))  # fmt: skip
    assert second.variables["state"]["preview"] == [False, None, None, False]
    assert second.variables["cwd"]["preview"] != first.variables["cwd"]["preview"]


# -- workers with other settings ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    w = start_worker(
        tmp_path_factory, "--pool-size", "1", "--console-cap", "1000", "--timeout-status", "504",
        "--gpu-slots", "2",
        env={"STRATA_WORKER_TOKEN": "s3cret-token", "STRATA_WORKER_MAX_INPUT_BYTES": "4096"},
    )  # fmt: skip
    yield w
    w.stop()


def test_spawned_kernels_serve_cells(tmp_path_factory: pytest.TempPathFactory) -> None:
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--kernel-start", "spawn")
    try:
        with httpx.Client(base_url=w.url, timeout=60) as c:
            source = "import os, sys\nparent = os.getppid()\nlauncher = sys.argv[0]"
            v = run_ok(c, source).variables
        assert v["parent"]["preview"] == w.proc.pid  # a child of the worker, not forked
        assert v["launcher"]["preview"].endswith("ipykernel_launcher.py")
    finally:
        w.stop()


def test_token_gate(guarded: WorkerProcess) -> None:
    with httpx.Client(base_url=guarded.url, timeout=60) as c:
        assert c.get("/health").status_code == 200
        response = execute(c, "x = 1")
        assert response.status_code == 401
        assert response.json()["detail"] == (
            "Missing or malformed Authorization header (expected Bearer token)"
        )
        response = execute(c, "x = 1", headers={"Authorization": "Bearer wrong"})
        assert response.json()["detail"] == "Invalid worker token"
        response = c.post("/v1/execute", content=b"garbage", headers={"Authorization": "Basic x"})
        assert response.status_code == 401  # auth before the body is read


def test_secret_never_reaches_the_kernel_and_gpu_slot_is_pinned(guarded: WorkerProcess) -> None:
    auth = {"Authorization": "Bearer s3cret-token"}
    with httpx.Client(base_url=guarded.url, timeout=60, headers=auth) as c:
        source = (
            "import os\ntoken = os.environ.get('STRATA_WORKER_TOKEN')\n"
            "everywhere = any('s3cret-token' in v for v in os.environ.values())\n"
            "gpu = os.environ.get('CUDA_VISIBLE_DEVICES')\n"
            "import subprocess, sys\n"
            "child_gpu = subprocess.run([sys.executable, '-c', 'import os; "
            'print(os.environ["CUDA_VISIBLE_DEVICES"])\'], capture_output=True, '
            "text=True).stdout.strip()\n"
            # the worker, and the kernel's parent (the fork server)
            "blocks = [open(f'/proc/{p}/environ', 'rb').read() for p in (worker, os.getppid())]\n"
            "in_parent = any(b's3cret-token' in block for block in blocks)\n"
            "parent_seen = all(len(block) > 0 for block in blocks)"
        )
        worker = ({"name": "worker", "format": "json/object"}, str(guarded.proc.pid).encode())
        # a caller's CUDA_VISIBLE_DEVICES never moves a cell off its kernel's GPU
        v = run_ok(c, source, [worker], env={"CUDA_VISIBLE_DEVICES": "7"}).variables
        assert v["token"]["preview"] is None and v["everywhere"]["preview"] is False
        # the worker's own initial environment block no longer holds it either
        assert v["parent_seen"]["preview"] is True and v["in_parent"]["preview"] is False
        assert v["gpu"]["preview"] in {"0", "1"}
        assert v["child_gpu"]["preview"] == v["gpu"]["preview"]
        health = c.get("/health").json()
        assert health["gpu_slots"] == 2 and health["free_gpu_slots"] == 2


def test_a_gpu_listed_twice_is_two_slots(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Two kernels sharing one GPU: /health counts each slot, busy or free."""
    w = start_worker(tmp_path_factory, "--gpu-slots", "0,0", "--queue-wait", "30")
    try:
        with httpx.Client(base_url=w.url, timeout=60) as c:
            health = c.get("/health").json()
            assert (health["gpu_slots"], health["free_gpu_slots"]) == (2, 2)
            cell = "import time, os\ntime.sleep(1)\ngpu = os.environ['CUDA_VISIBLE_DEVICES']"
            running = Background(c, cell)
            wait_active(c)
            assert c.get("/health").json()["free_gpu_slots"] == 1
            assert read_bundle(running.response()).variables["gpu"]["preview"] == "0"
    finally:
        w.stop()


def test_input_cap_is_413(guarded: WorkerProcess) -> None:
    auth = {"Authorization": "Bearer s3cret-token"}
    with httpx.Client(base_url=guarded.url, timeout=60, headers=auth) as c:
        big = [({"name": "blob", "format": "pickle/object"}, pickle.dumps(b"x" * 10_000))]
        response = execute(c, "n = len(blob)", big)
        assert response.status_code == 413
        assert "blob" in response.json()["detail"]
        small = [({"name": "blob", "format": "pickle/object"}, pickle.dumps(b"x" * 100))]
        assert run_ok(c, "n = len(blob)", small).variables["n"]["preview"] == 100


def test_console_cap_and_timeout_status_option(guarded: WorkerProcess) -> None:
    auth = {"Authorization": "Bearer s3cret-token"}
    with httpx.Client(base_url=guarded.url, timeout=60, headers=auth) as c:
        bundle = run_ok(c, "print('y' * 50_000)")
        assert len(bundle.stdout()) < 1200
        assert "output truncated" in bundle.stdout()
        response = execute(c, "import time\ntime.sleep(30)", timeout_seconds=0.5)
        assert response.status_code == 504


def test_busy_worker_queues_with_202_then_503_when_full(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    import threading

    w = start_worker(
        tmp_path_factory, "--pool-size", "1", "--queue-wait", "0.2", "--queue-depth", "1"
    )
    try:
        with (
            httpx.Client(base_url=w.url, timeout=60) as c,
            httpx.Client(base_url=w.url, timeout=60) as other,
        ):
            result: dict[str, httpx.Response] = {}
            thread = threading.Thread(
                target=lambda: result.update(r=execute(other, "import time\ntime.sleep(2)\na = 1"))
            )
            thread.start()
            deadline = time.monotonic() + 10
            # running, not just admitted: an admitted request still waits (queued) for a kernel
            while c.get("/health").json()["pool"]["kernels"].get("busy", 0) < 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            accepted = execute(c, "b = 2")
            assert accepted.status_code == 202, accepted.text
            job_url = accepted.json()["job_url"]
            assert job_url.startswith("/v1/jobs/") and accepted.json()["position"] == 1
            assert c.get("/health").json()["queue_depth"] == 1
            full = execute(c, "c = 3")
            assert full.status_code == 503
            assert full.headers["retry-after"] == "5"
            assert "queue is full" in full.json()["detail"]
            states = set()
            while True:
                poll = c.get(job_url)
                if poll.headers["content-type"].startswith("application/x-tar"):
                    break
                states.add(poll.json()["state"])
                assert time.monotonic() < deadline + 20
                time.sleep(0.1)
            assert "queued" in states
            assert read_bundle(poll).variables["b"]["preview"] == 2
            assert c.get(job_url).status_code == 404  # collected: gone
            thread.join(30)
            assert read_bundle(result["r"]).variables["a"]["preview"] == 1
    finally:
        w.stop()


@pytest.mark.parametrize(
    ("route", "status", "start"),
    [
        ("/v1/execute", 400, "Invalid metadata: maximum recursion depth exceeded"),
        ("/v1/execute-manifest", 400, "Invalid manifest payload: maximum recursion depth exceeded"),
        ("/execute", 400, "Invalid manifest payload: maximum recursion depth exceeded"),
        ("/v1/mount-cache/cached", 422, "Mount cache probe body must be JSON"),
    ],
)
def test_json_nested_too_deep_is_a_clear_4xx_on_every_route(
    client: httpx.Client, route: str, status: int, start: str
) -> None:
    nested = b"[" * 100_000 + b"]" * 100_000
    if route == "/v1/execute":
        files = {"metadata": ("metadata.json", nested, "application/json")}
        response = client.post(route, files=files)
    else:
        response = client.post(route, content=nested, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    assert response.json()["detail"].startswith(start)
    assert run_ok(client, "after = 1").variables["after"]["preview"] == 1


def test_max_concurrent_refuses_what_it_cannot_admit_with_503(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    env = {"STRATA_WORKER_MAX_CONCURRENT": "1"}  # the reference's variable, read as its flag
    w = start_worker(tmp_path_factory, "--pool-size", "2", env=env)
    try:
        with (
            httpx.Client(base_url=w.url, timeout=60) as c,
            httpx.Client(base_url=w.url, timeout=60) as other,
        ):
            assert c.get("/health").json()["max_concurrent"] == 1
            running = Background(other, "import time\ntime.sleep(3)\na = 1")
            wait_active(c)
            # a kernel is free, but the worker admits one execution at a time
            refused = execute(c, "b = 2")
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "5"
            assert refused.json()["detail"] == "Worker is running 1 of 1 executions"
            assert read_bundle(running.response()).variables["a"]["preview"] == 1
            assert run_ok(c, "b = 2").variables["b"]["preview"] == 2
    finally:
        w.stop()


def test_max_concurrent_must_be_positive() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kernel_worker", "--max-concurrent", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--max-concurrent: must be at least 1, got 0" in done.stderr.replace("argument ", "")


def test_a_job_answered_202_frees_its_run_directory_when_it_ends_not_when_polled(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--queue-wait", "0.2")
    try:
        with (
            httpx.Client(base_url=w.url, timeout=60) as c,
            httpx.Client(base_url=w.url, timeout=60) as other,
        ):
            running = Background(other, "import time\ntime.sleep(2)")
            deadline = time.monotonic() + 10
            while c.get("/health").json()["pool"]["kernels"].get("busy", 0) < 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            blob = [({"name": "blob", "format": "pickle/object"}, pickle.dumps(b"x" * 2_000_000))]
            accepted = execute(c, "n = len(blob)", blob)
            assert accepted.status_code == 202, accepted.text
            assert running.response().status_code == 200
            # nobody polls yet: once the job has ended, its inputs are gone all the same
            while c.get("/health").json()["active_executions"] or list(w.run_dir.glob("skw-run-*")):
                assert time.monotonic() < deadline + 20, list(w.run_dir.glob("skw-run-*"))
                time.sleep(0.05)
            polled = c.get(accepted.json()["job_url"])
            assert read_bundle(polled).variables["n"]["preview"] == 2_000_000
    finally:
        w.stop()


def test_queued_job_that_times_out_reports_408_through_the_poll(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--queue-wait", "0")
    try:
        with httpx.Client(base_url=w.url, timeout=60) as c:
            accepted = execute(c, "import time\ntime.sleep(20)", timeout_seconds=0.5)
            assert accepted.status_code == 202
            deadline = time.monotonic() + 20
            while (body := c.get(accepted.json()["job_url"]).json())["state"] not in (
                "finished", "failed",
            ):  # fmt: skip
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert body["state"] == "failed" and body["status_code"] == 408
            assert "timed out" in body["error"]
    finally:
        w.stop()


# -- cancel and disconnect -------------------------------------------------------------------------


def _retired(c: httpx.Client, reason: str) -> int:
    return int(c.get("/health").json()["pool"]["retirements"][reason])


def test_cancel_route_stops_a_running_build(client: httpx.Client) -> None:
    import threading

    assert client.post("/v1/executions/nothing-here/cancel").json() == {
        "build_id": "nothing-here", "cancelled": False,
    }  # fmt: skip
    before = _retired(client, "cancelled")
    result: dict[str, httpx.Response] = {}
    meta = running_cell("import time\ntime.sleep(30)", "notebook-abc123")
    thread = threading.Thread(target=lambda: result.update(r=execute(client, "", metadata=meta)))
    started = time.monotonic()
    thread.start()
    wait_running(client, "notebook-abc123")
    answer = client.post("/v1/executions/notebook-abc123/cancel")
    assert answer.json() == {"build_id": "notebook-abc123", "cancelled": True}
    thread.join(20)
    assert result["r"].status_code == 409
    assert result["r"].json()["error"] == "execution was cancelled"
    assert time.monotonic() - started < 10
    assert _retired(client, "cancelled") == before + 1
    assert run_ok(client, "ok = 1").variables["ok"]["preview"] == 1


def test_client_disconnect_cancels_the_cell(client: httpx.Client, worker: WorkerProcess) -> None:
    before = _retired(client, "cancelled")
    timeout = httpx.Timeout(60, read=1.0)
    with (
        httpx.Client(base_url=worker.url, timeout=timeout) as impatient,
        pytest.raises(httpx.ReadTimeout),
    ):
        execute(impatient, "import time\ntime.sleep(30)")
    deadline = time.monotonic() + 10
    while _retired(client, "cancelled") < before + 1:
        assert time.monotonic() < deadline, "the abandoned cell kept its kernel busy"
        time.sleep(0.05)
    assert client.get("/health").json()["active_executions"] == 0


def test_output_dir_folders_come_back_in_dirs(client: httpx.Client) -> None:
    source = (
        "# @worker warm\n# @output_dir plots\n\n"
        "(plots / 'a.txt').write_text('alpha')\n"
        "(plots / 'sub').mkdir()\n(plots / 'sub' / 'b.bin').write_bytes(b'12345')\n"
        "import os\nos.symlink('/etc/passwd', plots / 'link')\n"
        "kind = type(plots).__name__"
    )
    bundle = run_ok(client, source)
    assert bundle.manifest["output_dirs"] == {"plots": {"a.txt": 5, "sub/b.bin": 5}}
    assert bundle.members["dirs/plots/a.txt"] == b"alpha"
    assert bundle.members["dirs/plots/sub/b.bin"] == b"12345"
    assert "plots" not in bundle.variables
    assert bundle.variables["kind"]["preview"].endswith("Path")
    assert not any(name.endswith("link") for name in bundle.members)


def test_huge_previews_are_bounded(client: httpx.Client) -> None:
    bundle = run_ok(
        client, "blob = b'x' * 5_000_000\nitems = list(range(200_000))\ntext = 'y' * 100_000"
    )
    assert len(bundle.members["manifest.json"]) < 400_000
    for name in ("blob", "items", "text"):
        assert bundle.variables[name]["preview_truncated"] is True
    assert bundle.file("items").startswith(b"[")  # the value itself is whole in its file
    assert len(json.loads(bundle.file("items"))) == 200_000
    # a preview keeps its shape: the leading items that fit, not a repr of the whole
    items = bundle.variables["items"]["preview"]
    assert isinstance(items, list) and 1000 < len(items) < 200_000
    assert items == list(range(len(items)))


def test_a_wide_tables_preview_keeps_whole_rows(client: httpx.Client) -> None:
    source = (
        "import pandas as pd\ndf = pd.DataFrame({f'c{i}': ['x' * 20] * 30 for i in range(200)})"
    )
    meta = run_ok(client, source).variables["df"]
    rows = meta["preview"]
    assert meta["preview_truncated"] is True and meta["rows"] == 30
    assert isinstance(rows, list) and 1 <= len(rows) < 20
    assert all(row == ["x" * 20] * 200 for row in rows)
    big = run_ok(client, "a = {'k': 'z' * 70_000, 'other': 1}").variables["a"]["preview"]
    assert isinstance(big, dict) and list(big) == ["k"] and big["k"].startswith("zzz")


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/execute"), ("POST", "/v1/notebook-execute"), ("POST", "/v1/execute-manifest"),
     ("POST", "/execute"), ("GET", "/v1/jobs/some-job"), ("POST", "/v1/executions/b1/cancel"),
     ("POST", "/v1/mount-cache/cached"), ("GET", "/metrics")],
)  # fmt: skip
def test_every_route_but_health_is_token_gated(
    guarded: WorkerProcess, method: str, path: str
) -> None:
    with httpx.Client(base_url=guarded.url, timeout=30) as c:
        response = c.request(method, path, content=b"{not even json")
        assert response.status_code == 401, response.text
        wrong = c.request(method, path, headers={"Authorization": "Bearer nope"})
        assert wrong.json()["detail"] == "Invalid worker token"
        for open_path in ("/health", "/openapi.json", "/docs"):
            assert c.get(open_path).status_code == 200


# -- run directories on a disk (file work in threads) ------------------------------------------


def test_memory_backed_agrees_with_stat(tmp_path_factory: pytest.TempPathFactory) -> None:
    from kernel_worker.settings import memory_backed

    for path in (Path("/dev/shm"), tmp_path_factory.getbasetemp(), Path("/proc"), Path("/")):
        if not path.exists():
            continue
        kind = subprocess.run(
            ["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert memory_backed(path) == (kind in ("tmpfs", "ramfs")), (path, kind)


def test_worker_with_run_dirs_on_disk(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The same answers when run dirs are on a disk (the file work then runs in threads)."""
    disk = tmp_path_factory.mktemp("disk-runs")
    w = start_worker(tmp_path_factory, "--pool-size", "1", run_dir=disk)
    try:
        with httpx.Client(base_url=w.url, timeout=120) as c:
            assert run_ok(c, "result = 41 + 1").variables["result"]["preview"] == 42
            table = pa.table({"x": list(range(1000))})
            spec = {"name": "df", "format": "arrow/ipc", "file": "df.arrow"}
            bundle = run_ok(c, "total = int(df['x'].sum())", [(spec, arrow_stream(table))])
            assert bundle.variables["total"]["preview"] == 499500
            big = run_ok(c, "import pandas as pd\nout = pd.DataFrame({'v': range(100_000)})")
            assert pa.ipc.open_stream(big.file("out")).read_all().num_rows == 100_000
        deadline = time.monotonic() + 10  # run dirs are removed after each answer
        while list(disk.glob("skw-run-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        w.stop()  # asserts that no run directory was left behind


def test_bundle_compression_level_can_be_fixed(tmp_path_factory: pytest.TempPathFactory) -> None:
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--bundle-compresslevel", "9")
    try:
        with httpx.Client(base_url=w.url, timeout=60) as c:
            for source in ("x = 1", "import os\nnoise = os.urandom(2_000_000)"):
                response = execute(c, source)
                assert read_bundle(response).manifest["success"]
                assert response.content[8] == 2  # XFL 2: the slowest, best level
    finally:
        w.stop()


def test_bundle_compression_is_chosen_by_what_compresses(client: httpx.Client) -> None:
    """Incompressible outputs are stored (deflating them only costs time); text is deflated."""
    # the first deflate block's type says how it was written: stored, or deflated
    noise = execute(client, "import os\nnoise = os.urandom(2_000_000)")
    assert read_bundle(noise).manifest["success"]
    assert first_block_stored(noise.content) and len(noise.content) > 2_000_000
    text = execute(client, "text = 'a,b,c\\n1,2,3\\n' * 200_000")
    assert read_bundle(text).manifest["success"]
    assert not first_block_stored(text.content) and len(text.content) < 500_000
    small = execute(client, "x = 1")
    assert not first_block_stored(small.content)


@pytest.mark.parametrize("stream", ["sys.stdout", "sys.stderr", "sys.__stderr__"])
def test_a_cell_that_closes_a_standard_stream_does_not_break_the_next(
    solo: httpx.Client, stream: str
) -> None:
    """A closed stream cannot be reopened: the kernel is not verified clean and is replaced."""
    run_ok(solo, f"import sys\n{stream}.close()\nx = 1")
    bundle = run_ok(solo, "import sys, warnings\nprint('out')\nprint('err', file=sys.stderr)\n"
                          "warnings.warn('careful')\ny = 2")  # fmt: skip
    assert bundle.stdout() == "out\n"
    assert bundle.stderr().startswith("err\n") and "UserWarning: careful" in bundle.stderr()


@pytest.mark.slow
def test_a_cell_that_breaks_the_kernels_reply_is_a_502_not_a_timeout(solo: httpx.Client) -> None:
    """The kernel goes idle without replying: a prompt 502 (not a 408 after the cell's whole
    timeout), and the next request runs on a new kernel."""
    for _ in range(4):  # the grace's timer could fire a hair early; it was a 408 in 1 of 5
        response = execute(solo, "get_ipython().user_expressions = None", timeout_seconds=30)
        assert response.status_code == 502, response.text
        assert "stopped answering" in response.json()["detail"]
        assert run_ok(solo, "x = 1").variables["x"]["preview"] == 1


@pytest.mark.parametrize(
    "breaker",
    [
        "import json\njson.JSONEncoder.item_separator = ';'",
        "import json\njson.JSONEncoder.encode = lambda self, o: '{bad'",
    ],
    ids=["separator", "encode"],
)
def test_a_cell_that_garbles_the_kernels_messages_is_a_502_not_a_timeout(
    solo: httpx.Client, breaker: str
) -> None:
    """Every message the kernel sends after the cell is unreadable (its reply and its idle
    status among them): a 502 at once, not a 408 after the cell's whole timeout."""
    response = execute(solo, breaker, timeout_seconds=60)
    assert response.status_code == 502, response.text
    assert "stopped answering" in response.json()["detail"]
    assert run_ok(solo, "x = 1").variables["x"]["preview"] == 1


def test_an_output_the_kernel_could_not_send_readably_is_said_to_be_lost(
    solo: httpx.Client,
) -> None:
    """json.dumps patched for the cell's own run: its last expression's result went out
    unreadable (the kernel's reply, sent after the patch was undone, is fine). It was
    dropped without a word."""
    bundle = run_ok(solo, "import json\njson.dumps = lambda *a, **k: 'patched'\n42")
    assert "an output of this cell was lost" in bundle.stderr()
    assert run_ok(solo, "import json\nr = json.dumps([1])").variables["r"]["preview"] == "[1]"


@pytest.mark.parametrize(
    ("change", "probe", "seen"),
    [
        ("get_ipython().run_cell = lambda *a, **k: None", "r = 2", 2),
        ("get_ipython().input_transformers_cleanup.append("
         "lambda lines: [l.replace('1 + 1', '666') for l in lines])", "r = 1 + 1", 2),
        ("import ast\nclass T(ast.NodeTransformer):\n    def visit_Constant(self, node):\n"
         "        return ast.Constant(999)\nget_ipython().ast_transformers.append(T())",
         "r = 5", 5),
        ("get_ipython().ast_transformers.clear()\nimport string\nstring.ascii_letters = 'x'",
         "import string\nr = string.ascii_letters[:3]", "abc"),
        ("import sys\nclass S:\n    pass\nsys.stdout = S()", "print('out')\nr = 1", 1),
    ],
    ids=["run_cell", "input transformer", "ast transformer", "transformers cleared", "stdout"],
)  # fmt: skip
def test_a_cell_that_changes_the_kernels_machinery_does_not_reach_the_next(
    solo: httpx.Client, change: str, probe: str, seen: object
) -> None:
    first = execute(solo, change)
    assert first.status_code == 200, first.text
    assert run_ok(solo, probe).variables["r"]["preview"] == seen


def test_health_stays_200_while_the_only_kernel_is_replaced(solo: httpx.Client) -> None:
    """Strata's client refuses a cell needing a feature check when /health is not 200: it
    must not flicker while a timed-out kernel is replaced. /ready waits for a warm kernel."""
    assert execute(solo, "import time\ntime.sleep(60)", timeout_seconds=1).status_code == 408
    seen: set[tuple[int, str]] = set()
    ready_codes: set[int] = set()
    deadline = time.monotonic() + 30
    while True:
        health = solo.get("/health")
        seen.add((health.status_code, health.json()["status"]))
        ready = solo.get("/ready")
        ready_codes.add(ready.status_code)
        if ready.status_code == 200:
            break
        assert ready.json()["ready"] is False
        assert time.monotonic() < deadline, ready.text
    assert seen == {(200, "healthy")}
    assert ready.json()["ready"] is True and ready.json()["kernels"].get("idle", 0) >= 1
