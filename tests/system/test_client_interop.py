"""The real Strata client (strata-notebook 0.11) sends cells to our running worker.

Set ``STRATA_INTEROP_PYTHON`` to a Python (>= 3.12) with ``strata-notebook[notebook]``
installed (``scripts/interop-env.sh`` builds one and prints its path); these tests are skipped
only when it is unset.

- ``tests/interop/client_dispatch_check.py`` runs there and drives the worker through the
  client's ``CellExecutor.execute_cell`` (direct transport): request building, the response
  checks, bundle unpacking and artifact storage are all the client's own code.
- The CLI test runs the §18 recipe of the reference-behaviour note: ``strata new``,
  ``strata worker add``, ``strata cell add`` and ``strata run --format json``, with two cells on
  the worker and a local one reading their outputs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import WorkerProcess, start_worker
from tests.wire import execute

INTEROP_PYTHON = os.environ.get("STRATA_INTEROP_PYTHON")
SCRIPT = Path(__file__).parents[1] / "interop" / "client_dispatch_check.py"
CASES = [
    "simple",
    "dataframe",
    "error",
    "stdout",
    "display",
    "last_expression",
    "figure",
    "uppercase",
    "timeout",
    "rebound",
]

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(not INTEROP_PYTHON, reason="STRATA_INTEROP_PYTHON is not set"),
]


def run_check(execute_url: str, *cases: str) -> tuple[int, dict[str, Any], str]:
    assert INTEROP_PYTHON is not None
    proc = subprocess.run(
        [INTEROP_PYTHON, str(SCRIPT), execute_url, *cases],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode in (0, 1), f"the check script failed:\n{proc.stderr}"
    return proc.returncode, json.loads(proc.stdout.splitlines()[-1]), proc.stderr


@pytest.fixture(scope="module")
def client_run(worker: WorkerProcess) -> dict[str, Any]:
    """Every case of the check script, run once against the shared worker."""
    _, summary, _ = run_check(worker.url + "/v1/execute")
    return summary


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES)
def test_real_client_dispatch(client_run: dict[str, Any], case: str) -> None:
    assert client_run["entry_point"] == "strata.notebook.executor.CellExecutor.execute_cell"
    assert client_run["strata_notebook"].startswith("0.11.")
    outcome = client_run["cases"][case]
    assert outcome["problems"] == [], json.dumps(outcome, indent=1)
    assert outcome["results"], "no cell of this case ran"


@pytest.mark.timeout(300)
def test_real_client_sees_the_key_values(client_run: dict[str, Any]) -> None:
    """Spot checks on the summary itself, so the test does not rest on the script alone."""
    cases = client_run["cases"]
    simple = cases["simple"]["results"]["simple"]
    assert (simple["status"], simple["outputs"]["x"]["preview"]) == ("ready", 2)
    assert cases["dataframe"]["sent"]["df_remote"]["df"]["content_type"] == "arrow/ipc"
    assert cases["dataframe"]["results"]["df_check"]["outputs"]["back"]["preview"] == [2, 4, 6]
    assert cases["error"]["results"]["error"]["error"] == "boom from the cell"
    assert cases["stdout"]["results"]["stdout"]["stdout"] == "hello from the kernel\n"
    assert cases["display"]["results"]["display"]["displays"][0]["markdown_text"] == "# hi"


@pytest.mark.timeout(120)
def test_check_script_reports_a_failing_worker(worker: WorkerProcess) -> None:
    """The checker can fail: a URL that answers 404 is reported, not passed."""
    returncode, summary, stderr = run_check(worker.url + "/v1/no-such-route", "simple")
    assert returncode == 1
    problems = summary["cases"]["simple"]["problems"]
    assert any("returned 404" in p for p in problems), problems
    assert "simple:" in stderr


# ---- the `strata` command line, end to end ------------------------------------------------


def _uv() -> str | None:
    assert INTEROP_PYTHON is not None
    beside = Path(INTEROP_PYTHON).parent / "uv"
    return str(beside) if beside.is_file() else shutil.which("uv")


def _uv_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(
        UV_CACHE_DIR=str(tmp / "uv-cache"),
        UV_PYTHON_DOWNLOADS="never",
        UV_NO_SYNC="1",  # `uv run` for the local cell must not resolve the notebook's deps
        UV_OFFLINE="1",
        UV_NO_CONFIG="1",
    )
    return env


def _uv_venv_on_interop(uv: str, target: Path, env: dict[str, str]) -> Path:
    """A uv-created venv (the CLI refuses others) that sees the interop site-packages."""
    assert INTEROP_PYTHON is not None
    subprocess.run(
        [uv, "venv", "--quiet", "--python", INTEROP_PYTHON, str(target)],
        env=env,
        check=True,
        timeout=120,
    )
    paths = subprocess.run(
        [INTEROP_PYTHON, "-c", "import site; print('\\n'.join(site.getsitepackages()))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    python = target / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    ).stdout.strip()
    Path(purelib, "_strata_interop.pth").write_text(paths)
    return python


CLI_MAIN = "import sys; from strata.cli import main; sys.exit(main())"


class StrataCli:
    """The `strata` console script, run from a uv-created venv."""

    def __init__(self, python: Path, env: dict[str, str], cwd: Path) -> None:
        self.python, self.env, self.cwd = python, env, cwd

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.python), "-c", CLI_MAIN, *args],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        if check:
            assert proc.returncode == 0, f"strata {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
        return proc


def _leases_served(worker: WorkerProcess) -> int:
    served: int = httpx.get(worker.url + "/health", timeout=10).json()["pool"]["leases_served"]
    return served


def _cells_by_stdout(report: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [(c["status"], c.get("cache_hit"), c.get("stdout")) for c in report["cells"]]


@pytest.mark.timeout(420)
def test_strata_cli_runs_a_notebook_on_the_worker(worker: WorkerProcess, tmp_path: Path) -> None:
    uv = _uv()
    if uv is None:
        pytest.skip("uv is not installed beside STRATA_INTEROP_PYTHON nor on PATH")
    env = _uv_env(tmp_path)
    env["PATH"] = f"{Path(uv).parent}{os.pathsep}{env.get('PATH', '')}"  # the local cell's `uv run`
    cli_python = _uv_venv_on_interop(uv, tmp_path / "cli-venv", env)
    strata = StrataCli(cli_python, env, tmp_path)

    strata("new", "demo", "--no-env", "--no-git")
    demo = tmp_path / "demo"
    _uv_venv_on_interop(uv, demo / ".venv", env)  # `strata run --no-sync` needs it
    strata("worker", "add", "demo", "skw", "--url", worker.url + "/v1/execute")
    cells = [
        "# @worker skw\nimport pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})\nn = 5\n"
        "def helper(k):\n    return k * 10\n"
        "class Person:\n    def __init__(self, name, age):\n        self.name, self.age = name, age\n"
        "    def __str__(self):\n        return f'{self.name}:{self.age}'\nprint('made df')",
        # On the worker: helper, Person and n arrive as module/cell exports.
        "# @worker skw\ntotal = int(df['a'].sum()) + n\nh = helper(2)\np = Person('John', 20)\n"
        "print(total)",
        # Local: the reference harness reads the worker's arrow, json and module/cell(-instance)
        # outputs.
        "result = total + h\nprint('result', result, type(df).__name__, helper(1), str(p))",
    ]
    for source in cells:
        strata("cell", "add", "demo", "--no-sync", "-c", source)

    before = _leases_served(worker)
    first = strata("run", "demo", "--no-sync", "--format", "json", check=False)
    report = json.loads(first.stdout)
    assert first.returncode == 0 and report["success"] is True, first.stdout + first.stderr
    assert _cells_by_stdout(report) == [
        ("ok", False, "made df\n"),
        ("ok", False, "11\n"),
        ("ok", False, "result 31 DataFrame 10 John:20\n"),
    ]
    assert _leases_served(worker) - before == 2  # the two # @worker cells ran on our kernels

    again = strata("run", "demo", "--no-sync", "--format", "json", check=False)
    report = json.loads(again.stdout)
    assert again.returncode == 0 and report["success"] is True, again.stdout + again.stderr
    assert [c["cache_hit"] for c in report["cells"]] == [True, True, True]
    assert _leases_served(worker) - before == 2


@pytest.mark.timeout(300)
def test_real_client_follows_a_202_job_to_its_bundle(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A busy worker answers 202; the real client polls the job URL and gets the bundle."""
    w = start_worker(
        tmp_path_factory, "--pool-size", "1", "--queue-wait", "0", "--log-level", "info",
        capture_logs=True,
    )  # fmt: skip
    try:
        with httpx.Client(base_url=w.url, timeout=60) as c:
            blocker = threading.Thread(target=lambda: execute(c, "import time\ntime.sleep(8)"))
            blocker.start()
            deadline = time.monotonic() + 10
            while c.get("/health").json()["pool"]["kernels"]["busy"] < 1:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            code, summary, stderr = run_check(w.url + "/v1/execute", "simple")
            blocker.join(30)
        assert code == 0, stderr
        assert summary["cases"]["simple"]["problems"] == [], summary
        assert "GET /v1/jobs/" in w.logs()  # the client really went through the job URL
    finally:
        w.stop()
