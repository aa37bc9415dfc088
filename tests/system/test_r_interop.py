"""An R cell feeds a Python cell (and back) of one Strata notebook, run on this worker by
strata-notebook 0.11's own code (``tests/interop/r_cells_check.py`` in the interop Python,
``STRATA_INTEROP_PYTHON``): Strata's client sends the R cells with ``language: "r"`` because
``/health`` lists ``r``, and stores their bundles as it stores a reference worker's.

Skipped where the interop environment or R is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kernel_worker.languages.r.support import probe_r
from tests.conftest import start_worker

SCRIPT = Path(__file__).parents[1] / "interop" / "r_cells_check.py"

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(probe_r() is not None, reason="R with IRkernel is not installed"),
]


def interop_python() -> Path:
    found = os.environ.get("STRATA_INTEROP_PYTHON")
    if not found or not Path(found).is_file():
        pytest.skip("no interop environment: set STRATA_INTEROP_PYTHON (scripts/interop-env.sh)")
    return Path(found)


def outputs(report: dict[str, Any], cell: str) -> dict[str, Any]:
    result = report["results"][cell]
    assert result["success"] is True, json.dumps(result, indent=1)
    assert result["execution_method"] == "executor" and result["remote_worker"] == "skw"
    return {name: output.get("preview") for name, output in result["outputs"].items()}


@pytest.mark.timeout(300)
def test_an_r_cell_feeds_a_python_cell_through_strata(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    python = interop_python()
    workdir = tmp_path_factory.mktemp("r-notebook")
    worker = start_worker(tmp_path_factory, "--pool-size", "1")
    try:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))
        }
        proc = subprocess.run(
            [str(python), str(SCRIPT), worker.url + "/v1/execute", str(workdir)],
            capture_output=True, text=True, timeout=240, check=False, env=env, cwd=workdir,
        )  # fmt: skip
    finally:
        worker.stop()
    assert proc.returncode in (0, 1), f"the check script failed:\n{proc.stderr}"
    report: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    assert report["problems"] == [], proc.stderr
    made = outputs(report, "make")
    assert made["count"] == "3" and "2024-01-02" in made["measures"]
    plot = report["results"]["make"]["displays"][0]
    assert plot["content_type"] == "image/png" and plot["inline_data_url"].startswith(
        "data:image/png"
    )
    used = outputs(report, "use")
    assert used["frame_type"] == "DataFrame"  # an R data frame reached Python as pandas
    assert used["total"] == 4.0 and used["labels"] == ["a", "b"] and used["rows"] == 3
    assert used["kinds"] == ["lo", "hi", "lo"] and used["first_day"] == "2024-01-01"
    back = outputs(report, "back")
    assert back == {"score_sum": "42", "score_class": "data.frame"}  # and pandas back to R
