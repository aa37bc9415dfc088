"""R cells on real IRkernel kernels, through real HTTP: inputs and outputs of every type,
data frames both ways, plots, console, errors, timeout and cancel, what a later request
sees of an earlier one, folders, env, and a worker without R.

One worker for the module (one Python kernel, one R kernel: requests follow each other on
the same R kernel, which is what the isolation tests need).
"""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pyarrow as pa
import pytest

from kernel_worker.languages.r.support import probe_r
from tests.conftest import WorkerProcess, start_worker, wait_gone
from tests.wire import Bundle, execute, read_bundle, v1_metadata

pytestmark = pytest.mark.skipif(
    probe_r() is not None,
    reason="R with IRkernel and jsonlite is not installed (.ci/run installs it)",
)


@pytest.fixture(scope="module")
def r_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--r-pool-size", "1")
    yield w
    w.stop()


@pytest.fixture(scope="module")
def client(r_worker: WorkerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=r_worker.url, timeout=120) as c:
        yield c


def run_r(client: httpx.Client, source: str, *args: Any, **kwargs: Any) -> Bundle:
    return read_bundle(execute(client, source, *args, language="r", **kwargs))


def run_r_ok(client: httpx.Client, source: str, *args: Any, **kwargs: Any) -> Bundle:
    bundle = run_r(client, source, *args, **kwargs)
    assert bundle.manifest["success"], bundle.manifest
    return bundle


def arrow_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def read_arrow(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def test_health_lists_r(client: httpx.Client) -> None:
    features = client.get("/health").json()["capabilities"]["features"]
    assert features["languages"] == ["python", "r"]
    assert features["locked_r_environments"] is False


def test_atomic_values_and_lists_are_json(client: httpx.Client) -> None:
    bundle = run_r_ok(
        client,
        "n <- 3L\nx <- c(1.5, 2, NA)\ns <- 'héllo'\nb <- TRUE\n"
        "l <- list(a = 1, b = list('u', NULL))\nthird <- 0.1 + 0.2\n.hidden <- 1\n"
        "f <- function() 1",
    )
    variables = bundle.variables
    assert set(variables) == {"n", "x", "s", "b", "l", "third"}  # no dot names, no functions
    for name in variables:
        assert variables[name]["content_type"] == "json/object"
        assert variables[name]["file"] == f"files/{name}.json"
    values = {name: json.loads(bundle.file(name)) for name in variables}
    assert values == {
        "n": 3, "x": [1.5, 2, None], "s": "héllo", "b": True,
        "l": {"a": 1, "b": ["u", None]}, "third": 0.1 + 0.2,  # exactly
    }  # fmt: skip
    assert variables["s"]["preview"] == "héllo"
    assert variables["l"]["preview"] == "list of length 2"
    assert variables["x"]["bytes"] == len(bundle.file("x"))


def test_json_inputs_and_only_new_or_rebound_names(client: httpx.Client) -> None:
    inputs = [
        ({"name": "cfg", "format": "json/object", "file": "cfg.json"}, b'{"k": [1, 2], "t": "v"}'),
        ({"name": "kept", "format": "json/object", "file": "kept.json"}, b"5"),
        ({"name": "grown", "format": "json/object", "file": "grown.json"}, b"[1]"),
    ]
    bundle = run_r_ok(
        client,
        "total <- cfg$k[[1]] + cfg$k[[2]] + kept\ngrown <- c(unlist(grown), 2)\nlabel <- cfg$t",
        inputs,
    )
    assert set(bundle.variables) == {"total", "grown", "label"}  # cfg and kept only read
    assert json.loads(bundle.file("total")) == 8
    assert json.loads(bundle.file("grown")) == [1, 2]


def test_paths_and_text_inputs(client: httpx.Client) -> None:
    inputs = [
        ({"name": "notes", "format": "text/markdown", "file": "notes.md"}, "# Tïtle\n".encode()),
        ({"name": "raw", "format": "file/path", "file": "raw.csv"}, b"a,b\n1,2\n"),
    ]
    bundle = run_r_ok(client, "title <- notes\nparsed <- read.csv(raw)$b", inputs)
    assert json.loads(bundle.file("title")) == "# Tïtle\n"
    assert json.loads(bundle.file("parsed")) == 2


def test_other_objects_are_rds_that_r_reads_back(client: httpx.Client) -> None:
    first = run_r_ok(
        client,
        "m <- matrix(1:6, nrow = 2)\nfit <- lm(y ~ x, data.frame(x = 1:4, y = c(2, 4, 6, 8)))",
    )
    for name in ("m", "fit"):
        entry = first.variables[name]
        assert entry["content_type"] == "application/x-r-rds"
        assert entry["file"] == f"files/{name}.rds" and entry["r_only"] is True
    assert first.variables["fit"]["preview"] == "R-only lm"
    inputs = [
        ({"name": "m", "format": "application/x-r-rds", "file": "m.rds"}, first.file("m")),
        ({"name": "fit", "format": "application/x-r-rds", "file": "fit.rds"}, first.file("fit")),
    ]
    second = run_r_ok(client, "total <- sum(m)\nslope <- unname(coef(fit)[2])", inputs)
    assert json.loads(second.file("total")) == 21
    assert json.loads(second.file("slope")) == pytest.approx(2.0)


def test_a_data_frame_leaves_r_as_arrow(client: httpx.Client) -> None:
    bundle = run_r_ok(
        client,
        "df <- data.frame(num = c(1.5, NA, NaN), int = c(1L, NA, 3L), txt = c('a', NA, 'c'),\n"
        "  flag = c(TRUE, NA, FALSE), day = as.Date(c('2024-02-29', NA, '1970-01-01')),\n"
        "  kind = factor(c('lo', 'hi', 'lo')), stringsAsFactors = FALSE)",
    )
    entry = bundle.variables["df"]
    assert entry["content_type"] == "arrow/ipc" and entry["file"] == "files/df.arrow"
    assert entry["rows"] == 3 and entry["columns"] == 6
    assert "2024-02-29" in entry["preview"]
    table = read_arrow(bundle.file("df"))
    assert table.schema.metadata is None  # a Python cell reads it as a pandas DataFrame
    assert [str(t) for t in table.schema.types] == [
        "double", "int32", "string", "bool", "date32[day]", "string",
    ]  # fmt: skip
    columns = table.to_pydict()
    assert columns["num"][:2] == [1.5, None] and columns["num"][2] != columns["num"][2]  # NaN
    assert columns["int"] == [1, None, 3]
    assert columns["txt"] == ["a", None, "c"]
    assert columns["flag"] == [True, None, False]
    assert [str(d) if d else d for d in columns["day"]] == ["2024-02-29", None, "1970-01-01"]
    assert columns["kind"] == ["lo", "hi", "lo"]


def test_a_data_frame_reaches_r_and_comes_back(client: httpx.Client) -> None:
    frame = pd.DataFrame(
        {
            "x": [1.25, None, 3.0],
            "n": pd.array([1, None, 2**40], dtype="Int64"),
            "small": [1, 2, 3],
            "s": ["p", None, "r"],
            "ok": [True, False, None],
            "when": pd.to_datetime(["2024-01-01 12:00", None, "2024-03-01 00:00"]).tz_localize(
                "UTC"
            ),
            "cat": pd.Categorical(["u", "v", "u"]),
        }
    )
    data = arrow_bytes(pa.Table.from_pandas(frame, preserve_index=False))
    source = (
        "kinds <- vapply(df, function(col) class(col)[[1]], '')\n"
        "nas <- vapply(df, function(col) sum(is.na(col)), 0L)\n"
        "total <- sum(df$x, na.rm = TRUE)\nlevels_of_cat <- levels(df$cat)\ndf2 <- df"
    )
    bundle = run_r_ok(
        client, source, [({"name": "df", "format": "arrow/ipc", "file": "df.arrow"}, data)]
    )
    kinds = json.loads(bundle.file("kinds"))
    assert kinds == ["numeric", "numeric", "integer", "character", "logical", "POSIXct", "factor"]
    assert json.loads(bundle.file("nas")) == [1, 1, 0, 1, 1, 1, 0]
    assert json.loads(bundle.file("total")) == 4.25
    assert json.loads(bundle.file("levels_of_cat")) == ["u", "v"]
    back = read_arrow(bundle.file("df2")).to_pandas()
    assert read_arrow(bundle.file("df2")).column("s").to_pylist() == ["p", None, "r"]
    assert back["x"].tolist()[0] == 1.25 and pd.isna(back["x"][1])
    assert back["n"].tolist()[2] == 2**40  # past R's int: a double, exactly
    assert back["when"][0] == pd.Timestamp("2024-01-01 12:00", tz="UTC")
    assert back["cat"].tolist() == ["u", "v", "u"]  # a factor comes back as strings


def test_python_only_inputs_are_a_clear_cell_error(client: httpx.Client) -> None:
    inputs = [({"name": "model", "format": "pickle/object", "file": "model.pickle"}, b"\x80\x05N.")]
    bundle = run_r(client, "y <- 1", inputs)
    assert bundle.status == 200 and bundle.manifest["success"] is False
    assert "Cannot use 'model' in an R cell" in bundle.manifest["error"]
    assert "pickle" in bundle.manifest["error"]
    assert bundle.variables == {}


def test_console_plots_and_visible_values(client: httpx.Client) -> None:
    bundle = run_r_ok(
        client,
        "cat('line one\\n')\nmessage('a note')\nwarning('careful')\nplot(1:10)\n"
        "hist(c(1, 2, 2, 3))\nx <- 2\nx * 21",
    )
    assert bundle.stdout() == "line one\n[1] 42\n"
    assert "a note\n" in bundle.stderr() and "careful" in bundle.stderr()
    displays = bundle.manifest["displays"]
    assert [d["file"] for d in displays] == ["files/__display__0.png", "files/__display__1.png"]
    for display in displays:
        png = bundle.members[display["file"]]
        assert png.startswith(b"\x89PNG") and display["bytes"] == len(png)
        assert (
            display["inline_data_url"] == "data:image/png;base64," + base64.b64encode(png).decode()
        )
        assert (display["width"], display["height"]) == (800, 600)
        assert display["content_type"] == "image/png" and display["preview"] is None


def test_an_r_error_is_a_failed_cell(client: httpx.Client) -> None:
    bundle = run_r(
        client, "cat('before\\n')\ncheck <- function(v) stop('bad value: ', v)\ncheck(7)"
    )
    manifest = bundle.manifest
    assert bundle.status == 200 and manifest["success"] is False
    assert manifest["error"] == "bad value: 7"
    assert manifest["traceback"].startswith("Error in check(7) : bad value: 7")
    assert bundle.stdout() == "before\n" and manifest["variables"] == {}
    parse_error = run_r(client, "x <- (1 + ")
    assert (
        parse_error.manifest["success"] is False and "unexpected" in parse_error.manifest["error"]
    )
    assert run_r_ok(client, "y <- 1").variables["y"]["preview"] == "1"


def test_a_later_request_sees_nothing_of_an_earlier_one(client: httpx.Client) -> None:
    first = run_r_ok(
        client,
        "pid <- Sys.getpid()\nassign('leaked', 1, envir = globalenv())\nlibrary(tools)\n"
        "options(digits = 3, skw.mine = TRUE)\nsetwd(tempdir())\nSys.setenv(SKW_LEAK = 'yes')\n"
        "set.seed(42)\nfile.create(file.path(tempdir(), 'left.txt'))\n"
        "png(file.path(tempdir(), 'open.png'))\ncon <- file(file.path(tempdir(), 'c.txt'), 'w')\n"
        "sink(con)",
    )
    second = run_r_ok(
        client,
        "pid <- Sys.getpid()\nglobals <- ls(globalenv(), all.names = TRUE)\n"
        "attached <- 'package:tools' %in% search()\ndigits <- getOption('digits')\n"
        "mine <- is.null(getOption('skw.mine'))\nwd <- basename(getwd())\n"
        "env <- Sys.getenv('SKW_LEAK')\nseeded <- exists('.Random.seed', globalenv())\n"
        "left <- file.exists(file.path(tempdir(), 'left.txt'))\ndevices <- length(dev.list())\n"
        "cat('visible\\n')",
    )
    value = {name: json.loads(second.file(name)) for name in second.variables}
    assert value["pid"] == json.loads(first.file("pid"))  # the same kernel, reset
    assert "leaked" not in value["globals"]
    assert value["attached"] is False and value["digits"] == 7 and value["mine"] is True
    assert value["env"] == "" and value["seeded"] is False and value["left"] is False
    assert value["devices"] == 2  # the kernel's own, and the one capturing this cell's plots
    assert second.stdout() == "visible\n"  # the earlier sink is gone
    assert value["wd"] == "work"


def test_what_a_reset_cannot_take_back_retires_the_kernel(client: httpx.Client) -> None:
    first = run_r_ok(
        client, "pid <- Sys.getpid()\nsetClass('Point', representation(x = 'numeric'))"
    )
    second = run_r_ok(
        client, "pid <- Sys.getpid()\ndefined <- existsMethod('show', 'Point') || isClass('Point')"
    )
    assert json.loads(second.file("pid")) != json.loads(first.file("pid"))
    assert json.loads(second.file("defined")) is False


def test_env_mounts_and_output_folders(client: httpx.Client, tmp_path: Path) -> None:
    bundle = run_r_ok(
        client,
        "# @output_dir plots\nvalue <- Sys.getenv('SKW_R_SETTING')\n"
        "writeLines('hello', file.path(plots, 'note.txt'))\nfolder <- basename(plots)",
        env={"SKW_R_SETTING": "on"},
    )
    assert json.loads(bundle.file("value")) == "on"
    assert bundle.manifest["output_dirs"] == {"plots": {"note.txt": 6}}
    assert bundle.members["dirs/plots/note.txt"] == b"hello\n"
    assert "plots" not in bundle.variables  # bound before the cell: not an output


@pytest.mark.slow  # a worker (or an R kernel) of its own
def test_a_timeout_retires_the_kernel(client: httpx.Client) -> None:
    response = execute(client, "Sys.sleep(60)", language="r", timeout_seconds=1)
    assert response.status_code == 408
    assert response.json()["error"].startswith("Cell execution timed out after 1s")
    assert run_r_ok(client, "after <- 1").variables["after"]["preview"] == "1"


@pytest.mark.slow  # a worker (or an R kernel) of its own
def test_cancel_stops_a_running_r_cell(client: httpx.Client, tmp_path: Path) -> None:
    marker = tmp_path / "running"
    source = "writeLines('x', Sys.getenv('SKW_MARKER'))\nSys.sleep(60)"
    answer: list[httpx.Response] = []
    meta = v1_metadata(source, [], language="r", env={"SKW_MARKER": str(marker)})
    meta["build_id"] = "r-cancel-1"
    thread = threading.Thread(target=lambda: answer.append(execute(client, "", metadata=meta)))
    thread.start()
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert time.monotonic() < deadline, "the R cell never started"
        time.sleep(0.05)
    assert client.post("/v1/executions/r-cancel-1/cancel").json()["cancelled"] is True
    thread.join(30)
    assert answer and answer[0].status_code == 409
    assert run_r_ok(client, "again <- 2").variables["again"]["preview"] == "2"


def test_python_cells_still_run_beside_r(client: httpx.Client) -> None:
    bundle = read_bundle(execute(client, "x = 40 + 2"))
    assert bundle.manifest["success"] and bundle.variables["x"]["preview"] == 42


def test_other_languages_are_refused(client: httpx.Client) -> None:
    response = execute(client, "1", language="julia")
    assert response.status_code == 400
    assert response.json()["detail"] == "unsupported cell language 'julia'"


@pytest.mark.slow  # a worker (or an R kernel) of its own
def test_without_r_an_r_cell_gets_the_reference_answer(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    worker = start_worker(tmp_path_factory, "--pool-size", "1", "--r-kernels", "off")
    try:
        with httpx.Client(base_url=worker.url, timeout=60) as c:
            languages = c.get("/health").json()["capabilities"]["features"]["languages"]
            assert languages == ["python"]
            response = execute(c, "x <- 1", language="r")
            assert response.status_code == 500
            assert response.json() == {
                "detail": "Rscript is not installed on this worker",
                "success": False,
                "error": "Rscript is not installed on this worker",
            }
    finally:
        worker.stop()


@pytest.mark.slow  # a worker (or an R kernel) of its own
def test_r_kernels_die_with_a_killed_worker(tmp_path_factory: pytest.TempPathFactory) -> None:
    worker = start_worker(tmp_path_factory, "--pool-size", "1")
    try:
        with httpx.Client(base_url=worker.url, timeout=60) as c:
            pid = json.loads(run_r_ok(c, "pid <- Sys.getpid()").file("pid"))
        worker.remember_kernels()
        assert pid in worker.kernel_pids
        worker.proc.kill()  # no shutdown: the kernel's own watch must end it
        worker.proc.wait(10)
        wait_gone([pid], 10, "the R kernel outlived its killed worker")
        wait_gone(worker.kernel_pids, 10, "a kernel's process outlived its killed worker")
    finally:
        worker.stop()
