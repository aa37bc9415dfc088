"""A notebook with its own locked dependency runs its worker cells in that environment.

Run it with the interpreter that has ``strata-notebook[notebook]`` installed (Python >= 3.12),
with ``uv`` and a Python 3.12 on ``PATH``::

    python locked_env_check.py EXECUTE_URL WORKDIR

Everything is Strata's own code, driven as a user would drive it:

1. ``create_notebook`` writes a notebook pinned to Python 3.12 (``requires-python ==3.12.*``);
   ``add_dependency`` (what ``strata dep add`` calls) runs ``uv add humanize``, which writes
   ``uv.lock`` and syncs the notebook's ``.venv``; ``update_notebook_workers`` writes the
   ``[[workers]]`` entry naming the worker at EXECUTE_URL, and every cell of the notebook
   asks for it with ``# @worker skw``.
2. ``CellExecutor.execute_cell`` runs the cells in notebook order. Before each one the
   client asks the worker's ``/health`` whether it runs cells in a locked environment and,
   when it does, sends the notebook's lock in ``params.environment``: the first cell imports
   humanize, the second reads the first's output.
3. A second notebook, with no ``uv.lock``, sends a cell to the same worker: no environment
   is sent, so it runs in the worker's own.

After each cell the worker's ``/health`` ``environments`` section is recorded, so the caller
can tell a build from a warm kernel. A wrapper around ``_locked_environment`` records what
the client decided to send (its key and Python); it calls the real method.

Prints one JSON line on stdout::

    {"strata_notebook": "0.11.x", "dependency": {...}, "sent": {cell: {...} | null},
     "results": {cell: result}, "health": {cell: environments}, "problems": [...]}

Exit status: 0 when every step ran (the caller judges the values); 1 when the client raised
or the dependency could not be added (``problems`` says which); 2 usage.
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

import httpx
from strata.notebook.dependencies import add_dependency
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


PACKAGE = "humanize"  # small, pure Python, and not in the worker's own environment
LOCKED_CELLS = [
    (
        "fetch",
        TAG + "import sys, humanize\n"
        "package_version = humanize.__version__\n"
        "minor = '%d.%d' % sys.version_info[:2]\n"
        "prefix = sys.prefix\n"
        "size = humanize.naturalsize(3_000_000)\n",
    ),
    (
        "again",  # reads the first cell's output, in the same environment
        TAG + "import sys, humanize\n"
        "label = humanize.intcomma(1_234_567) + ' / ' + size\n"
        "again_minor = '%d.%d' % sys.version_info[:2]\n",
    ),
]
PLAIN_CELLS = [
    (
        "plain",  # a notebook without a lock: the worker's own environment
        TAG + "import importlib.util, sys\n"
        "import pandas as pd\n"
        "plain_minor = '%d.%d' % sys.version_info[:2]\n"
        "rows = len(pd.DataFrame({'a': [1, 2, 3]}))\n"
        "has_package = importlib.util.find_spec('humanize') is not None\n",
    ),
]


class RecordingExecutor(CellExecutor):
    """The real executor; it notes the lock it decided to send for each cell."""

    def __init__(self, session: NotebookSession) -> None:
        super().__init__(session)
        self.origin = "run"  # as `strata run` sets it
        self.sent: list[dict[str, str] | None] = []

    async def _locked_environment(self, *args: Any, **kwargs: Any) -> dict[str, str] | None:
        spec = await super()._locked_environment(*args, **kwargs)
        self.sent.append(None if spec is None else {"key": spec["key"], "python": spec["python"]})
        return spec


def write_notebook(parent: Path, name: str, execute_url: str, cells: list[tuple[str, str]]) -> Path:
    """A notebook pinned to Python 3.12 whose cells go to the worker at ``execute_url``."""
    notebook_dir = create_notebook(parent, name, "3.12", initialize_environment=False)
    spec = WorkerSpec(
        name=WORKER,
        backend=WorkerBackendType.EXECUTOR,
        runtime_id="strata-kernel-worker-interop",
        config={"url": execute_url},
    )
    update_notebook_workers(notebook_dir, [spec])
    previous: str | None = None
    for cell_id, source in cells:
        add_cell_to_notebook(notebook_dir, cell_id, previous)
        write_cell(notebook_dir, cell_id, source)
        previous = cell_id
    return notebook_dir


async def run_cells(
    session: NotebookSession, cells: list[tuple[str, str]], health_url: str, report: dict[str, Any]
) -> None:
    executor = RecordingExecutor(session)
    async with httpx.AsyncClient(timeout=30) as client:
        for cell_id, source in cells:
            try:
                result = await executor.execute_cell(cell_id, source)
            except Exception as exc:  # the client raised instead of reporting: a finding
                report["problems"].append(f"{cell_id}: the client raised {exc!r}")
                traceback.print_exc()
                return
            summary = json.loads(json.dumps(result.to_dict(), default=str))
            summary["success"] = result.success
            report["results"][cell_id] = summary
            report["sent"][cell_id] = executor.sent[-1] if executor.sent else "not asked"
            health = (await client.get(health_url)).json()
            report["health"][cell_id] = health.get("environments")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    execute_url, workdir = argv[0], Path(argv[1])
    health_url = execute_url.rsplit("/v1/", 1)[0] + "/health"
    logging.disable(logging.INFO)  # the client logs each step at INFO on stderr
    report: dict[str, Any] = {
        "strata_notebook": importlib.metadata.version("strata-notebook"),
        "dependency": None,
        "sent": {},
        "results": {},
        "health": {},
        "problems": [],
    }
    locked = write_notebook(workdir, "locked", execute_url, LOCKED_CELLS)
    added = add_dependency(locked, PACKAGE, timeout=300)
    report["dependency"] = {
        "success": added.success,
        "error": added.error,
        "lockfile_changed": added.lockfile_changed,
        "uv_lock": (locked / "uv.lock").is_file(),
        "requires_python": "==3.12.*" in (locked / "pyproject.toml").read_text(),
    }
    if not added.success:
        report["problems"].append(f"uv add {PACKAGE} failed: {added.error}")
    else:
        session = NotebookSession(parse_notebook(locked), locked)
        asyncio.run(run_cells(session, LOCKED_CELLS, health_url, report))
        plain = write_notebook(workdir, "plain", execute_url, PLAIN_CELLS)
        session = NotebookSession(parse_notebook(plain), plain)
        session.venv_python = Path(sys.executable)  # no lock, so no .venv of its own
        asyncio.run(run_cells(session, PLAIN_CELLS, health_url, report))
    print(json.dumps(report))
    for problem in report["problems"]:
        print(problem, file=sys.stderr)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
