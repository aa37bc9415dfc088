"""R cells and Python cells of one Strata notebook, on this worker, through Strata's code.

Run it with the interpreter that has ``strata-notebook[notebook]`` installed (Python >= 3.12)::

    python r_cells_check.py EXECUTE_URL WORKDIR

Strata's writer makes a notebook whose cells all ask for the worker at EXECUTE_URL
(``# @worker skw`` and a ``[[workers]]`` entry): an R cell that makes a data frame, a
count and a plot; a Python cell that reads the R data frame and makes a DataFrame of its
own; an R cell that reads that one. ``CellExecutor.execute_cell`` runs them in order: the
client sends each R cell with ``params.language = "r"`` (the worker's ``/health`` lists
``r``) and stores what comes back as it stores a reference worker's outputs.

Prints one JSON line on stdout::

    {"strata_notebook": "0.11.x", "results": {cell: result}, "problems": [...]}

Exit status: 0 when every cell ran (the caller judges the values); 1 when the client raised;
2 usage.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import sys
import traceback
from pathlib import Path
from typing import Any

from strata.notebook.executor import CellExecutor
from strata.notebook.models import WorkerBackendType, WorkerSpec
from strata.notebook.parser import parse_notebook
from strata.notebook.session import NotebookSession
from strata.notebook.writer import (
    add_cell_to_notebook,
    create_notebook,
    update_notebook_workers,
    write_cell,
)

WORKER = "skw"
TAG = f"# @worker {WORKER}\n"
CELLS = [
    (
        "make",
        "r",
        TAG + "measures <- data.frame(x = c(1.5, 2.5, NA), label = c('a', 'b', NA),\n"
        "  day = as.Date(c('2024-01-01', '2024-01-02', '2024-01-03')),\n"
        "  kind = factor(c('lo', 'hi', 'lo')))\ncount <- nrow(measures)\nplot(measures$x)\n",
    ),
    (
        "use",
        "python",
        TAG + "import pandas as pd\n"
        "frame_type = type(measures).__name__\n"
        "total = float(measures['x'].sum())\n"
        "labels = [v for v in measures['label'].tolist() if isinstance(v, str)]\n"
        "kinds = [str(v) for v in measures['kind'].tolist()]\n"
        "first_day = str(measures['day'].tolist()[0])\n"
        "rows = count\n"
        "scores = pd.DataFrame({'v': [10, 20, 12], 'who': ['p', 'q', 'r']})\n",
    ),
    (
        "back",
        "r",
        TAG + "score_sum <- sum(scores$v)\nscore_class <- class(scores)[[1]]\n",
    ),
]


def write_notebook(parent: Path, execute_url: str) -> Path:
    notebook_dir = create_notebook(parent, "rcells", "3.12", initialize_environment=False)
    spec = WorkerSpec(
        name=WORKER,
        backend=WorkerBackendType.EXECUTOR,
        runtime_id="strata-kernel-worker-interop",
        config={"url": execute_url},
    )
    update_notebook_workers(notebook_dir, [spec])
    previous: str | None = None
    for cell_id, language, source in CELLS:
        add_cell_to_notebook(notebook_dir, cell_id, previous, language=language)
        write_cell(notebook_dir, cell_id, source)
        previous = cell_id
    return notebook_dir


async def run_cells(session: NotebookSession, report: dict[str, Any]) -> None:
    executor = CellExecutor(session)
    executor.origin = "run"  # as `strata run` sets it
    for cell_id, _language, source in CELLS:
        try:
            result = await executor.execute_cell(cell_id, source)
        except Exception as exc:  # the client raised instead of reporting: a finding
            report["problems"].append(f"{cell_id}: the client raised {exc!r}")
            traceback.print_exc()
            return
        summary = json.loads(json.dumps(result.to_dict(), default=str))
        summary["success"] = result.success
        report["results"][cell_id] = summary


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    execute_url, workdir = argv[0], Path(argv[1])
    logging.disable(logging.INFO)  # the client logs each step at INFO on stderr
    report: dict[str, Any] = {
        "strata_notebook": importlib.metadata.version("strata-notebook"),
        "results": {},
        "problems": [],
    }
    notebook = write_notebook(workdir, execute_url)
    session = NotebookSession(parse_notebook(notebook), notebook)
    session.venv_python = Path(sys.executable)  # no lock, so no .venv of its own
    asyncio.run(run_cells(session, report))
    print(json.dumps(report))
    for problem in report["problems"]:
        print(problem, file=sys.stderr)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
