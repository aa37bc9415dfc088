"""A Strata notebook with its own dependency runs on this worker, in its locked environment.

Everything on the client side is strata-notebook 0.11's own code, in the interop Python
(``STRATA_INTEROP_PYTHON``; ``scripts/interop-env.sh`` builds ``.venv-interop``):
``tests/interop/locked_env_check.py`` makes a notebook pinned to Python 3.12 with Strata's
writer, adds ``humanize`` with its ``add_dependency`` (``uv add``: ``pyproject.toml`` and
``uv.lock``), routes its cells to this worker with ``# @worker skw`` and a ``[[workers]]``
entry, and runs them through ``CellExecutor.execute_cell``. The client sends the lock because
``/health`` advertises ``locked_environments``; the worker builds the environment into a
temporary ``--env-root`` and runs the cells on a warm kernel of it.

Skipped only where the interop environment or a Python 3.12 is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kernel_worker.environments import probe_uv
from tests.conftest import WorkerProcess, start_worker
from tests.envfixtures import py312_fixture  # noqa: F401

SCRIPT = Path(__file__).parents[1] / "interop" / "locked_env_check.py"
PACKAGE = "humanize"

pytestmark = pytest.mark.interop


def interop_python() -> Path:
    found = os.environ.get("STRATA_INTEROP_PYTHON")
    if not found or not Path(found).is_file():
        pytest.skip("no interop environment: set STRATA_INTEROP_PYTHON (scripts/interop-env.sh)")
    return Path(found)


def client_path(python: Path, py312: Path) -> str:
    """Python 3.12's bin first (uv finds the notebook's interpreter there), then a uv: the
    one beside the interop Python, else the one this worker builds with."""
    beside = python.parent / "uv"
    uv = str(beside) if beside.is_file() else probe_uv()
    dirs = [str(py312.parent), *([str(Path(uv).parent)] if uv else [])]
    return os.pathsep.join([*dirs, os.environ.get("PATH", "")])


def run_notebook(python: Path, worker: WorkerProcess, workdir: Path, path: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(PATH=path, UV_PYTHON_DOWNLOADS="never")
    proc = subprocess.run(
        [str(python), str(SCRIPT), worker.url + "/v1/execute", str(workdir)],
        capture_output=True, text=True, timeout=240, check=False, env=env, cwd=workdir,
    )  # fmt: skip
    assert proc.returncode in (0, 1), f"the check script failed:\n{proc.stderr}"
    report: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    assert report["problems"] == [], proc.stderr
    return report


def outputs(report: dict[str, Any], cell: str) -> dict[str, Any]:
    """A cell's outputs by name (their previews), after checking it ran on the worker."""
    result = report["results"][cell]
    assert result["success"] is True, json.dumps(result, indent=1)
    assert result["execution_method"] == "executor" and result["remote_worker"] == "skw"
    return {name: output.get("preview") for name, output in result["outputs"].items()}


def pools(environments: dict[str, Any]) -> list[tuple[str, int]]:
    """The environments' pools in ``/health``: kind and live kernels."""
    return [(pool["kind"], pool["kernels"]) for pool in environments["pools"]]


@pytest.mark.timeout(300)
def test_a_notebook_with_its_own_dependency_runs_in_its_locked_environment(
    tmp_path_factory: pytest.TempPathFactory, py312: Path
) -> None:
    python = interop_python()
    env_root = tmp_path_factory.mktemp("interop-envs")
    path = client_path(python, py312)
    worker = start_worker(
        tmp_path_factory, "--pool-size", "1", "--env-root", str(env_root), env={"PATH": path}
    )
    try:
        report = run_notebook(python, worker, tmp_path_factory.mktemp("notebooks"), path)
    finally:
        worker.stop()

    assert report["strata_notebook"].startswith("0.11.")
    dependency = report["dependency"]
    assert dependency["success"] and dependency["uv_lock"] and dependency["requires_python"]
    # the client sent the notebook's lock, pinned to 3.12, with both of its cells
    sent = report["sent"]
    assert sent["fetch"] is not None, "the client sent no lock: /health did not advertise it"
    assert sent["fetch"]["python"] == "3.12" and len(sent["fetch"]["key"]) == 64
    assert sent["again"] == sent["fetch"]

    fetched = outputs(report, "fetch")
    assert fetched["minor"] == "3.12"  # the worker itself runs another Python
    assert fetched["size"] == "3.0 MB" and fetched["package_version"]
    assert Path(fetched["prefix"]).resolve().is_relative_to(env_root.resolve())
    built = report["health"]["fetch"]
    assert built["prepared"] == {"built": 1}, built
    assert [kernels for _, kernels in pools(built)] == [1]

    # the next cell reads the first one's output on a warm kernel of the same environment
    again = outputs(report, "again")
    assert again["label"] == "1,234,567 / 3.0 MB" and again["again_minor"] == "3.12"
    warm = report["health"]["again"]
    assert warm["prepared"] == {"built": 1, "cached": 1}, warm  # nothing built again
    assert pools(warm) == pools(built)  # the same one pool, the same one kernel
    assert warm["on_disk"] == 1

    # a notebook without a lock: no environment sent, the worker's own environment, where
    # pandas is and humanize is not
    assert report["sent"]["plain"] is None
    plain = outputs(report, "plain")
    assert (
        plain["plain_minor"] == f"{sys.version_info.major}.{sys.version_info.minor}"
        and plain["rows"] == 3
    )
    assert plain["has_package"] is False
    assert report["health"]["plain"]["prepared"] == warm["prepared"]
