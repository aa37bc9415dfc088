"""Drive a worker with the real Strata client (strata-notebook 0.11), the way a notebook does.

Run it with the interpreter that has ``strata-notebook[notebook]`` installed (Python >= 3.12)::

    python client_dispatch_check.py EXECUTE_URL [CASE ...]

EXECUTE_URL is what a notebook's ``[[workers]]`` entry holds as ``config.url``, e.g.
``http://127.0.0.1:9000/v1/execute``. CASEs default to all of: simple, dataframe, error,
stdout, display, last_expression, figure, uppercase, timeout.

Entry point: ``strata.notebook.executor.CellExecutor.execute_cell``, the call the Strata
server and ``strata run`` make for each cell. No Strata server is needed: the script builds a
throwaway notebook on disk with the client's own writer, opens a ``NotebookSession`` on it and
registers the worker as a direct-transport executor (``backend = "executor"``). Cells tagged
``# @worker skw`` then go through the client's ``_dispatch_http_executor``: executor-v1
envelope, one multipart part per input file, the header checks, ``unpack_notebook_output_bundle``
and the client's storage of outputs and displays as artifacts. Cells without the tag run in the
client's own harness (the reference serializer), so the DataFrame case feeds the worker an
``arrow/ipc`` artifact made by the reference, and reads the worker's output back with it.

Two adaptations, both within the client's own seams: the session's interpreter is this one
(a notebook would have its own ``.venv``), and the local harness is started directly instead
of through ``uv run`` (``_harness_command`` exists to be replaced this way). A wrapper around
``_dispatch_http_executor`` records which inputs the client sent; it calls the real method.

Prints one JSON line on stdout::

    {"entry_point": ..., "strata_notebook": "0.11.0", "worker_url": ...,
     "cases": {CASE: {"problems": [...], "results": {cell: result}, "sent": {cell: inputs}}}}

Exit status: 0 every case as expected; 1 some case differs (its ``problems`` say how, and are
also printed on stderr); 2 usage.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import json
import logging
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from strata.notebook.executor import CellExecutionResult, CellExecutor
from strata.notebook.models import WorkerBackendType, WorkerSpec
from strata.notebook.parser import parse_notebook
from strata.notebook.session import NotebookSession
from strata.notebook.writer import add_cell_to_notebook, create_notebook, write_cell

WORKER = "skw"
TAG = f"# @worker {WORKER}\n"
ENTRY_POINT = "strata.notebook.executor.CellExecutor.execute_cell"
TIMEOUT_LIMIT_SECONDS = 2

# Cells of the throwaway notebook, in notebook order: (case, cell id, source).
CELLS: list[tuple[str, str, str]] = [
    ("simple", "simple", TAG + "x = 1 + 1"),
    (
        "dataframe",
        "df_make",  # local: the reference harness serializes df as arrow/ipc
        "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3], 'b': [0.5, 1.5, 2.5]})",
    ),
    (
        "dataframe",
        "df_remote",  # on the worker: df arrives as the client sends it
        TAG + "total = int(df['a'].sum())\ndoubled = df * 2\nkind = type(df).__name__",
    ),
    (
        "dataframe",
        "df_check",  # local again: the reference reads the worker's arrow output
        "back = doubled['a'].tolist()\nhalves = doubled['b'].tolist()\n"
        "dtype = str(doubled['a'].dtype)",
    ),
    ("error", "error", TAG + "print('before the error')\nraise ValueError('boom from the cell')"),
    (
        "stdout",
        "stdout",
        TAG + "import sys\nprint('hello from the kernel')\nprint('to stderr', file=sys.stderr)\n"
        "y = 42",
    ),
    ("display", "display", TAG + "display(Markdown('# hi'))"),
    ("last_expression", "last_expression", TAG + "display(Markdown('# First'))\n42"),
    (
        "figure",
        "figure",
        TAG + "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
    ),
    (
        "uppercase",
        "upper_make",  # on the worker: names with capitals get hashed file stems
        TAG + "import pandas as pd\nTotal = 7\nScores = pd.DataFrame({'v': [1, 2]})",
    ),
    ("uppercase", "upper_check", "z = Total + 1\nn_scores = len(Scores)"),
    (
        "timeout",
        "timeout",
        TAG + f"# @timeout {TIMEOUT_LIMIT_SECONDS}\nimport time\ntime.sleep(60)",
    ),
    (
        "rebound",
        "rebound_make",  # binds `display` to the very function the kernel's namespace holds
        TAG + "from IPython.display import display\ndisplay('first')\nlimit = 7",
    ),
    ("rebound", "rebound_use", TAG + "display('second')\nnext_limit = limit + 1"),
]
CASES = list(dict.fromkeys(case for case, _, _ in CELLS))


class CheckingExecutor(CellExecutor):
    """The real executor, with the local harness started without ``uv run``."""

    def __init__(self, session: NotebookSession) -> None:
        super().__init__(session)
        self.origin = "run"  # as `strata run` sets it
        self.sent: dict[str, dict[str, Any]] = {}

    def _harness_command(
        self, manifest_path: Path, venv_python: Path, harness_user: Any
    ) -> list[str] | None:
        return [str(venv_python), str(self.harness_path), str(manifest_path)]

    async def _dispatch_http_executor(self, *args: Any, **kwargs: Any) -> Any:
        real = super()._dispatch_http_executor
        bound = inspect.signature(real).bind(*args, **kwargs)
        cell_id = bound.arguments.get("cell_id") or "?"
        output_dir = Path(bound.arguments["output_dir"])
        self.sent[cell_id] = {
            name: _describe_input(spec, output_dir)
            for name, spec in bound.arguments["input_specs"].items()
        }
        return await real(*args, **kwargs)


def _describe_input(spec: dict[str, Any], output_dir: Path) -> dict[str, Any]:
    described: dict[str, Any] = {
        "content_type": spec.get("content_type"),
        "file": spec.get("file"),
    }
    if spec.get("content_type") == "arrow/ipc":
        with pa.ipc.open_stream(pa.OSFile(str(output_dir / str(spec["file"])))) as reader:
            metadata = reader.schema.metadata or {}
        described["strata_metadata"] = {
            key.decode(): value.decode()
            for key, value in metadata.items()
            if key.startswith(b"strata.")
        }
    return described


def _summarize(result: CellExecutionResult, elapsed_seconds: float) -> dict[str, Any]:
    summary = json.loads(json.dumps(result.to_dict(), default=str))
    summary["success"] = result.success
    summary["elapsed_seconds"] = round(elapsed_seconds, 3)
    return summary


@dataclass
class Case:
    name: str
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def expect(self, cell: str, path: str, expected: Any, *, how: str = "==") -> None:
        """Compare ``results[cell]`` at a dotted *path* with *expected*."""
        actual: Any = self.results.get(cell)
        for part in path.split("."):
            if isinstance(actual, dict):
                actual = actual.get(part)
            elif isinstance(actual, list) and part.isdigit() and int(part) < len(actual):
                actual = actual[int(part)]
            else:
                actual = None
        ok = {
            "==": lambda: actual == expected,
            "in": lambda: isinstance(actual, str) and expected in actual,
            "startswith": lambda: isinstance(actual, str) and actual.startswith(expected),
            "<": lambda: isinstance(actual, int | float) and actual < expected,
        }[how]()
        if not ok:
            self.problems.append(f"{cell}.{path} = {actual!r}, expected {how} {expected!r}")

    def expect_ran_on_worker(self, cell: str) -> None:
        self.expect(cell, "execution_method", "executor")
        self.expect(cell, "remote_worker", WORKER)
        self.expect(cell, "remote_transport", "direct")


def check_simple(case: Case) -> None:
    case.expect("simple", "success", True)
    case.expect_ran_on_worker("simple")
    case.expect("simple", "outputs.x.content_type", "json/object")
    case.expect("simple", "outputs.x.preview", 2)
    case.expect("simple", "error", None)


def check_dataframe(case: Case) -> None:
    case.expect("df_make", "success", True)
    case.expect("df_make", "execution_method", "cold")  # the reference harness made df
    sent = case.sent.get("df_remote", {})
    expected_df = {
        "content_type": "arrow/ipc",
        "file": "df.arrow",
        "strata_metadata": {
            "strata.arrow.shape": "table",
            "strata.arrow.source": "pandas.DataFrame",
        },
    }
    if sent.get("df") != expected_df or set(sent) != {"df"}:
        case.problems.append(f"df_remote: the client sent {sent!r}, expected df as {expected_df}")
    case.expect("df_remote", "success", True)
    case.expect_ran_on_worker("df_remote")
    case.expect("df_remote", "outputs.total.preview", 6)
    case.expect("df_remote", "outputs.kind.preview", "DataFrame")
    case.expect("df_remote", "outputs.doubled.content_type", "arrow/ipc")
    case.expect("df_remote", "outputs.doubled.rows", 3)
    case.expect("df_remote", "outputs.doubled.columns", ["a", "b"])
    case.expect("df_check", "success", True)
    case.expect("df_check", "outputs.back.preview", [2, 4, 6])
    case.expect("df_check", "outputs.halves.preview", [1.0, 3.0, 5.0])
    case.expect("df_check", "outputs.dtype.preview", "int64")


def check_error(case: Case) -> None:
    case.expect("error", "success", False)
    case.expect_ran_on_worker("error")
    case.expect("error", "status", "error")
    case.expect("error", "error", "boom from the cell")  # str(exc), as the reference reports it
    case.expect("error", "traceback", "ValueError", how="in")
    case.expect("error", "stdout", "before the error\n")
    case.expect("error", "outputs", {})


def check_stdout(case: Case) -> None:
    case.expect("stdout", "success", True)
    case.expect_ran_on_worker("stdout")
    case.expect("stdout", "stdout", "hello from the kernel\n")
    case.expect("stdout", "stderr", "to stderr\n")
    case.expect("stdout", "outputs.y.preview", 42)


def check_display(case: Case) -> None:
    case.expect("display", "success", True)
    case.expect_ran_on_worker("display")
    displays = case.results.get("display", {}).get("displays")
    if not isinstance(displays, list) or len(displays) != 1:
        case.problems.append(f"display.displays = {displays!r}, expected one display")
    case.expect("display", "displays.0.content_type", "text/markdown")
    case.expect("display", "displays.0.markdown_text", "# hi")
    # The client stored the display as an artifact, from the bundle's file.
    case.expect("display", "displays.0.artifact_uri", "strata://artifact/", how="startswith")


def check_last_expression(case: Case) -> None:
    case.expect("last_expression", "success", True)
    case.expect_ran_on_worker("last_expression")
    case.expect("last_expression", "displays.0.content_type", "text/markdown")
    case.expect("last_expression", "displays.0.markdown_text", "# First")
    case.expect("last_expression", "displays.1.content_type", "json/object")
    case.expect("last_expression", "displays.1.preview", 42)
    case.expect("last_expression", "displays.2", None)
    case.expect("last_expression", "display.preview", 42)


def check_figure(case: Case) -> None:
    case.expect("figure", "success", True)
    case.expect_ran_on_worker("figure")
    case.expect("figure", "displays.0.content_type", "image/png")
    case.expect("figure", "displays.0.artifact_uri", "strata://artifact/", how="startswith")
    case.expect("figure", "displays.1", None)


def check_uppercase(case: Case) -> None:
    # The client stores a consumed output only if it finds the file by the reference's name
    # rule; otherwise the producing cell fails "to store output artifacts".
    case.expect("upper_make", "success", True)
    case.expect_ran_on_worker("upper_make")
    case.expect("upper_make", "error", None)
    case.expect("upper_check", "success", True)
    case.expect("upper_check", "outputs.z.preview", 8)
    case.expect("upper_check", "outputs.n_scores.preview", 2)


def check_timeout(case: Case) -> None:
    case.expect("timeout", "success", False)
    case.expect("timeout", "remote_error_code", "TIMEOUT")
    case.expect(
        "timeout",
        "error",
        f"Cell execution timed out after {float(TIMEOUT_LIMIT_SECONDS)}s",
        how="startswith",
    )
    # The client reports TIMEOUT both for a 408 and for its own HTTP timeout (30 s here):
    # only a prompt answer shows that the worker sent the 408.
    case.expect("timeout", "elapsed_seconds", 20, how="<")


def check_rebound(case: Case) -> None:
    # The client stores every name a cell binds that a later cell reads; one missing from the
    # bundle fails the producing cell "to store output artifacts".
    case.expect("rebound_make", "success", True)
    case.expect_ran_on_worker("rebound_make")
    case.expect("rebound_make", "error", None)
    case.expect("rebound_use", "success", True)
    case.expect("rebound_use", "outputs.next_limit.preview", 8)


CHECKS: dict[str, Callable[[Case], None]] = {
    "simple": check_simple,
    "dataframe": check_dataframe,
    "error": check_error,
    "stdout": check_stdout,
    "display": check_display,
    "last_expression": check_last_expression,
    "figure": check_figure,
    "uppercase": check_uppercase,
    "timeout": check_timeout,
    "rebound": check_rebound,
}


def open_notebook(parent: Path, execute_url: str) -> NotebookSession:
    notebook_dir = create_notebook(parent, "interop", initialize_environment=False)
    previous: str | None = None
    for _, cell_id, source in CELLS:
        add_cell_to_notebook(notebook_dir, cell_id, previous)
        write_cell(notebook_dir, cell_id, source)
        previous = cell_id
    state = parse_notebook(notebook_dir)
    state.workers = [
        WorkerSpec(
            name=WORKER,
            backend=WorkerBackendType.EXECUTOR,
            runtime_id="strata-kernel-worker-interop",
            config={"url": execute_url},
        )
    ]
    session = NotebookSession(state, notebook_dir)
    session.venv_python = Path(sys.executable)
    return session


async def run_cases(session: NotebookSession, cases: list[str]) -> dict[str, Case]:
    executor = CheckingExecutor(session)
    done: dict[str, Case] = {}
    for name in cases:
        case = done[name] = Case(name)
        for cell_case, cell_id, source in CELLS:
            if cell_case != name:
                continue
            started = time.monotonic()
            try:
                result = await executor.execute_cell(cell_id, source)
            except Exception as exc:  # the client raised instead of reporting: a finding
                case.problems.append(f"{cell_id}: the client raised {exc!r}")
                traceback.print_exc()
                continue
            case.results[cell_id] = _summarize(result, time.monotonic() - started)
            if cell_id in executor.sent:
                case.sent[cell_id] = executor.sent[cell_id]
        if not case.problems:
            CHECKS[name](case)
    return done


def main(argv: list[str]) -> int:
    if not argv or any(case not in CASES for case in argv[1:]):
        print(__doc__, file=sys.stderr)
        return 2
    execute_url, cases = argv[0], argv[1:] or CASES
    logging.disable(logging.INFO)  # the client logs each step at INFO on stderr
    with tempfile.TemporaryDirectory(prefix="skw-client-interop-") as tmp:
        session = open_notebook(Path(tmp), execute_url)
        done = asyncio.run(run_cases(session, cases))
    summary = {
        "entry_point": ENTRY_POINT,
        "strata_notebook": importlib.metadata.version("strata-notebook"),
        "worker_url": execute_url,
        "cases": {
            name: {"problems": c.problems, "results": c.results, "sent": c.sent}
            for name, c in done.items()
        },
    }
    print(json.dumps(summary))
    problems = [f"{name}: {p}" for name, c in done.items() for p in c.problems]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
