"""The README's Strata example, through the real ``strata`` CLI: what reaches a worker.

A cell sent to the worker runs in an empty run directory, so the notebook's files are not
there (reading ``data.parquet`` on the worker fails); an upstream cell that runs beside the
notebook reads the file (by its path: local cells run in the notebook's ``work/`` folder),
and its DataFrame reaches the worker as data. Needs the interop
environment (``scripts/interop-env.sh``), as the README's test command builds it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import WorkerProcess
from tests.system.test_client_interop import (
    INTEROP_PYTHON,
    StrataCli,
    _uv,
    _uv_env,
    _uv_venv_on_interop,
)

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(not INTEROP_PYTHON, reason="STRATA_INTEROP_PYTHON is not set"),
]


@pytest.mark.timeout(420)
def test_the_readme_example_runs_and_a_notebook_file_does_not_travel(
    worker: WorkerProcess, tmp_path: Path
) -> None:
    uv = _uv()
    if uv is None:
        pytest.skip("uv is not installed beside STRATA_INTEROP_PYTHON nor on PATH")
    env = _uv_env(tmp_path)
    env["PATH"] = f"{Path(uv).parent}{os.pathsep}{env.get('PATH', '')}"
    env["TMPDIR"] = str(tmp_path / "tmp")  # uv's lock files go with the test's folder
    (tmp_path / "tmp").mkdir()
    strata = StrataCli(_uv_venv_on_interop(uv, tmp_path / "cli-venv", env), env, tmp_path)
    strata("new", "demo", "--no-env", "--no-git")
    demo = tmp_path / "demo"
    _uv_venv_on_interop(uv, demo / ".venv", env)  # `strata run --no-sync` needs it
    data = demo / "data.parquet"  # beside the notebook (local cells run in its work/ folder)
    pq.write_table(pa.table({"a": [1.0, 2.0, 3.0]}), data)
    strata("worker", "add", "demo", "warm", "--url", worker.url + "/v1/execute")
    cells = [  # the README's two cells, then the one that cannot work
        f"import pandas as pd\ndf = pd.read_parquet({str(data)!r})",
        "# @worker warm\nsummary = df.describe()\nprint(int(summary.loc['count', 'a']))",
        '# @worker warm\nimport pandas as pd\nmissing = pd.read_parquet("data.parquet")',
    ]
    for source in cells:
        strata("cell", "add", "demo", "--no-sync", "-c", source)
    run = strata("run", "demo", "--no-sync", "--format", "json", check=False)
    report = json.loads(run.stdout)
    by_source = {c["id"]: c for c in report["cells"]}
    assert len(by_source) == 3, run.stdout + run.stderr
    outcomes = sorted((c["status"], c.get("stdout") or "") for c in report["cells"])
    # the local read and the worker's summary ran; the worker's own read did not
    assert outcomes == [("error", ""), ("ok", ""), ("ok", "3\n")], run.stdout + run.stderr
    (failed,) = [c for c in report["cells"] if c["status"] == "error"]
    assert "FileNotFoundError: data.parquet" in failed["traceback"]
    assert "/.venv/" in failed["traceback"]  # raised on the worker (its own venv), not locally
