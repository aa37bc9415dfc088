"""The notebooks under ``notebooks/`` run, so they never rot.

- ``strata-warm-model/``: a Strata notebook whose cells run on a kernel worker with a preloaded
  model. Its cells are sent in notebook order with our client, outputs passed forward as Strata
  passes them; with ``STRATA_INTEROP_PYTHON`` set it also runs through the real ``strata`` CLI.
- ``quickstart.ipynb``: executed with nbclient on this environment's ``python3`` kernel; the
  worker it starts must be gone afterwards, also when a cell fails.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nbformat
import pandas as pd
import psutil
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from traitlets.config import Config

from kernel_worker.client.session import CellResult, Client, EncodedInput
from tests.conftest import ROOT, WorkerProcess, start_worker

NOTEBOOKS = ROOT / "notebooks"
WARM_MODEL = NOTEBOOKS / "strata-warm-model"
QUICKSTART = NOTEBOOKS / "quickstart.ipynb"
INTEROP_PYTHON = os.environ.get("STRATA_INTEROP_PYTHON")


# -- the Strata notebook, cell by cell through our client ------------------------------------------


def _notebook_cells() -> list[tuple[str, str]]:
    """``(cell id, source)`` in notebook order, as ``notebook.toml`` lists them."""
    toml = tomllib.loads((WARM_MODEL / "notebook.toml").read_text())
    cells = sorted(toml["cells"], key=lambda cell: cell["order"])
    return [(c["id"], (WARM_MODEL / "cells" / c["file"]).read_text()) for c in cells]


def _free_names(source: str) -> set[str]:
    tree = ast.parse(source)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


@pytest.fixture(scope="module")
def model_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """One kernel with the notebook's preload, so every cell finds the same warm model."""
    preload = str((WARM_MODEL / "preload.py").relative_to(ROOT))
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--preload", preload)
    yield w
    w.stop()


def test_notebook_toml_routes_every_cell_to_the_executor_worker() -> None:
    toml = tomllib.loads((WARM_MODEL / "notebook.toml").read_text())
    (worker,) = toml["workers"]
    assert worker["backend"] == "executor"
    assert worker["config"]["url"] == "http://127.0.0.1:9000/v1/execute"
    for cell_id, source in _notebook_cells():
        assert source.startswith(f"# @worker {worker['name']}\n"), cell_id
        assert "MODEL =" not in source, f"{cell_id} must use the preloaded model, not build one"


def test_cells_run_in_order_on_the_warm_model(model_worker: WorkerProcess) -> None:
    available: dict[str, EncodedInput] = {}
    results: dict[str, CellResult] = {}
    with Client(model_worker.url + "/v1/execute", timeout_seconds=120) as client:
        for cell_id, source in _notebook_cells():
            inputs = {n: available[n] for n in sorted(_free_names(source)) if n in available}
            result = client.run(source, inputs).raise_for_error()
            available.update({name: result.outputs.encoded(name) for name in result.outputs})
            results[cell_id] = result

    listings = results["listings"].outputs["listings"]
    assert isinstance(listings, pd.DataFrame) and listings.shape == (40, 4)

    priced = results["price"].outputs["priced"]
    assert isinstance(priced, pd.DataFrame) and (priced["predicted_k"] > 0).all()
    assert "MODEL" not in results["price"].outputs  # used, never rebuilt or rebound

    (chart,) = results["chart"].displays
    assert chart.content_type == "image/png" and bytes(chart.data).startswith(b"\x89PNG")

    top = results["top"]
    table = top.outputs["top"]
    assert isinstance(table, pd.DataFrame)
    assert (
        table["predicted_k"].tolist() == priced.nlargest(5, "predicted_k")["predicted_k"].tolist()
    )
    assert top.displays[-1].content_type == "text/html" and "<table" in str(top.displays[-1].data)
    assert set(top.outputs["sensitivity"]) == {"area_m2", "rooms", "age_years", "distance_km"}

    # Both cells that used the model saw the one the preload trained: same training time.
    trained_at = results["price"].stdout.rsplit("trained at ", 1)[1].split()[0]
    assert f"trained at {trained_at}:" in top.stdout
    pool = httpx.get(model_worker.url + "/health", timeout=10).json()["pool"]
    assert pool["leases_served"] == 4 and sum(pool["retirements"].values()) == 0


# -- the Strata notebook through the real `strata` command line ------------------------------------


def _uv() -> str | None:
    assert INTEROP_PYTHON is not None
    beside = Path(INTEROP_PYTHON).parent / "uv"
    return str(beside) if beside.is_file() else shutil.which("uv")


def _offline_env(tmp: Path, uv: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(
        UV_CACHE_DIR=str(tmp / "uv-cache"),
        UV_PYTHON_DOWNLOADS="never",
        UV_NO_SYNC="1",
        UV_OFFLINE="1",
        UV_NO_CONFIG="1",
        PATH=f"{Path(uv).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    return env


def _uv_venv(uv: str, target: Path, env: dict[str, str]) -> Path:
    """A uv-made venv (the CLI insists on one) that sees the interop site-packages (§18)."""
    assert INTEROP_PYTHON is not None
    run = {"env": env, "check": True, "timeout": 120, "capture_output": True, "text": True}
    subprocess.run([uv, "venv", "--quiet", "--python", INTEROP_PYTHON, str(target)], **run)
    paths = subprocess.run(
        [INTEROP_PYTHON, "-c", "import site; print('\\n'.join(site.getsitepackages()))"], **run
    ).stdout
    python = target / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], **run
    ).stdout.strip()
    Path(purelib, "_strata_interop.pth").write_text(paths)
    return python


@pytest.mark.interop
@pytest.mark.timeout(420)
@pytest.mark.skipif(not INTEROP_PYTHON, reason="STRATA_INTEROP_PYTHON is not set")
def test_strata_runs_the_notebook_on_the_worker(
    model_worker: WorkerProcess, tmp_path: Path
) -> None:
    uv = _uv()
    if uv is None:
        pytest.skip("the strata CLI needs uv: not beside STRATA_INTEROP_PYTHON nor on PATH")
    env = _offline_env(tmp_path, uv)
    cli_python = _uv_venv(uv, tmp_path / "cli-venv", env)
    notebook = tmp_path / "strata-warm-model"
    shutil.copytree(WARM_MODEL, notebook, ignore=shutil.ignore_patterns(".strata", ".venv"))
    toml = notebook / "notebook.toml"
    default_url = 'url = "http://127.0.0.1:9000/v1/execute"'
    assert default_url in toml.read_text()
    toml.write_text(toml.read_text().replace(default_url, f'url = "{model_worker.url}/v1/execute"'))
    _uv_venv(uv, notebook / ".venv", env)  # `strata run --no-sync` uses the notebook's venv

    strata = [str(cli_python), "-c", "import sys; from strata.cli import main; sys.exit(main())"]
    proc = subprocess.run(
        [*strata, "run", str(notebook), "--no-sync", "--format", "json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report: dict[str, Any] = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["success"] is True, proc.stdout + proc.stderr
    cells = {cell["id"]: cell for cell in report["cells"]}
    assert [cells[i]["status"] for i in ("listings", "price", "chart", "top")] == ["ok"] * 4
    assert cells["listings"]["stdout"] == "40 listings\n"
    assert "priced 40 listings with price-rff-ridge" in cells["price"]["stdout"]


# -- quickstart.ipynb under nbclient ---------------------------------------------------------------


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _execute(nb: nbformat.NotebookNode, tmp: Path) -> tuple[CellExecutionError | None, list[int]]:
    """Run *nb* on a fresh ``python3`` kernel; return its error and the processes it leaked.

    Its temp files (the worker's log) go to *tmp*, not the machine's temp dir.
    """
    before = _descendants()
    seen: set[int] = set()

    def record(**_: object) -> None:  # after every cell: whatever the notebook started
        seen.update(_descendants() - before)

    config = Config()
    config.KernelManager.shutdown_wait_time = 60.0  # let atexit stop the worker unhurried
    client = NotebookClient(
        nb,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
        config=config,
        on_cell_executed=record,
        on_cell_error=record,
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["TMPDIR"] = str(tmp)
    error = None
    try:
        client.execute(env=env)
    except CellExecutionError as exc:
        error = exc
    processes = []
    for pid in sorted(seen):
        with contextlib.suppress(psutil.NoSuchProcess):
            processes.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(processes, timeout=30)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    leaked = [process.pid for process in alive]
    return error, leaked


def _outputs(cell: nbformat.NotebookNode) -> tuple[str, set[str]]:
    text = "".join(o.get("text", "") for o in cell.outputs if o["output_type"] == "stream")
    kinds = {kind for o in cell.outputs for kind in o.get("data", {})}
    return text, kinds


@pytest.mark.timeout(240)
def test_quickstart_runs_and_stops_its_worker(tmp_path: Path) -> None:
    nb = nbformat.read(QUICKSTART, as_version=4)
    error, leaked = _execute(nb, tmp_path)
    assert error is None, str(error)
    assert leaked == [], "the notebook's worker outlived it"
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(not [o for o in c.outputs if o["output_type"] == "error"] for c in code)
    texts = {i: _outputs(cell) for i, cell in enumerate(code)}
    assert "is ready on port" in texts[0][0]
    assert "6 sales, 548.5 in total" in texts[1][0] and "text/html" in texts[1][1]
    assert texts[2][0].startswith("image/png ") and "image/png" in texts[2][1]
    assert texts[3][0].startswith("False ZeroDivisionError division by zero")
    assert "warm kernel worker: median" in texts[4][0]
    assert "image/png" in texts[5][1]  # the latency plot
    assert "worker stopped with exit code" in texts[6][0]


@pytest.mark.timeout(240)
def test_quickstart_stops_its_worker_when_a_cell_fails(tmp_path: Path) -> None:
    nb = nbformat.read(QUICKSTART, as_version=4)
    first_code = next(i for i, cell in enumerate(nb.cells) if cell.cell_type == "code")
    nb.cells.insert(
        first_code + 1, nbformat.v4.new_code_cell("raise RuntimeError('a failed cell')")
    )
    error, leaked = _execute(nb, tmp_path)
    assert error is not None and "a failed cell" in str(error)
    assert leaked == [], "a failed notebook leaked its worker"
