"""The benchmark's library matrix (``python -m bench --cases libraries``): what it counts as a
retirement, how it reports latency per library, and its selection on the command line.

The measuring runs against real one-kernel workers (two tiny libraries: one that stays
warm, one whose cell kills its kernel); the report is checked on plain data.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from bench import cli
from bench.errors import Failure
from bench.library_bench import (
    CellRun,
    library_ratios,
    one_kernel_worker,
    retirement_goal,
    run_libraries,
    summarize_ours,
)
from bench.library_matrix import Library
from bench.measure import Attempt
from bench.plan import LibraryPlan
from bench.report import evaluate_targets, render_table

KEPT = Library("json", "json", "import json\ntext = json.dumps([1])\nwarm = id(json)")
DIES = Library("dies", "os", "import os\nwarm = id(os)\nos._exit(1)")
NONE = {"timeout": 0, "failed_reset": 0}


def _runs(*seconds_pid_warm: tuple[float, int, int]) -> list[CellRun]:
    return [CellRun(Attempt(s, 200, None), pid, warm) for s, pid, warm in seconds_pid_warm]


def _entry(ours: dict[str, object], reference: dict[str, object] | None) -> dict[str, object]:
    entry: dict[str, object] = {
        "module": "m",
        "ours": ours,
        "ratios": library_ratios(ours, reference),
    }
    if reference is not None:
        entry["reference"] = reference
    return entry


def test_a_changed_kernel_or_module_shows_and_misses_the_goal() -> None:
    kept = summarize_ours(_runs((0.5, 7, 1), (0.02, 7, 1), (0.01, 7, 1)), NONE, NONE, None)
    assert kept["retirements"] == {} and kept["same_kernel"] and kept["same_module"]
    assert kept["first"] == 0.5 and kept["second"] == 0.02 and kept["warm"]["p50"] == 0.015
    # a reset failed after the first run: a retirement counted, and another kernel (pid)
    retired = summarize_ours(_runs((0.4, 7, 1), (0.3, 8, 2)), NONE,
                             {"timeout": 0, "failed_reset": 1}, None)  # fmt: skip
    assert retired["retirements"] == {"failed_reset": 1} and retired["retired"] == 1
    assert retired["same_kernel"] is False and retired["same_module"] is False
    # a kernel replaced with no retirement counted still counts as one
    silent = summarize_ours(_runs((0.4, 7, 1), (0.02, 9, 1)), NONE, NONE, None)
    libraries = {"kept": _entry(kept, None), "retired": _entry(retired, None),
                 "silent": _entry(silent, None), "absent": {"module": "x", "skipped": "x is not installed"}}  # fmt: skip
    goal = retirement_goal(libraries)
    assert goal["retirements"] == 2 and goal["met"] is False and goal["libraries"] == 3
    assert goal["retired_libraries"] == ["retired", "silent"]
    assert goal["modules_reimported"] == ["retired"]
    assert retirement_goal({"kept": _entry(kept, None)})["met"] is True
    assert retirement_goal({})["met"] is None


def test_the_table_has_both_measures_per_library_the_reference_and_the_goal() -> None:
    kept = summarize_ours(_runs((0.5, 7, 1), (0.02, 7, 1), (0.01, 7, 1)), NONE, NONE, None)
    retired = summarize_ours(_runs((0.4, 7, 1), (0.3, 8, 1)), NONE,
                             {"timeout": 0, "failed_reset": 1}, None)  # fmt: skip
    ref = {"first": 1.0, "latency": {"p50": 0.9}, "problem": None}
    missing = {"first": None, "latency": None,
               "problem": "success=False error=\"No module named 'scipy'\""}  # fmt: skip
    libraries = {"numpy": _entry(kept, ref), "scipy": _entry(retired, missing)}
    results = {
        "meta": {"cases": ["libraries"]},
        "worker": {"libraries": {"warm_runs": 2, "libraries": libraries,
                                 "goal": retirement_goal(libraries)}},
    }  # fmt: skip
    assert libraries["numpy"]["ratios"] == {
        "first_vs_warm": pytest.approx(0.5 / 0.015),
        "reference_vs_ours": pytest.approx(0.9 / 0.015),
        "reference_first_vs_ours_first": pytest.approx(2.0),
    }
    results["targets"] = evaluate_targets(results)
    table = render_table(results)
    lines = table.splitlines()
    assert lines[0].startswith("LIBRARIES: retirements per library, second-run latency per library")
    numpy = next(line.split() for line in lines if line.startswith("numpy"))
    assert numpy == ["numpy", "3", "0", "same", "same", "500.0ms", "20.0ms", "15.0ms", "33x",
                     "900.0ms", "60x"]  # fmt: skip
    scipy = next(line for line in lines if line.startswith("scipy"))
    assert "1 (failed_reset 1)" in scipy and "NEW" in scipy
    assert "  not measured, reference: not installed in its environment: scipy" in lines
    assert (
        "  goal, zero retirements: MISSED (1 over 2 libraries, 5 runs; kernel lost by: scipy)"
        in lines
    )
    # only the target this selection measured is listed
    targets = lines[lines.index("TARGETS") + 1 :]
    assert len(targets) == 1 and "[MISSED ] worker: libraries, kernel retirements" in targets[0]


def test_cases_are_selected_by_name_and_kept_apart_from_the_whole_run() -> None:
    parser = cli.build_parser()
    assert cli._cases(parser.parse_args(["--cases", "libraries"]), parser) == {"libraries"}
    args = parser.parse_args(["--cases", "trivial,churn", "libraries"])
    assert cli._cases(args, parser) == {"trivial", "churn", "libraries"}
    assert cli.results_stem(frozenset({"trivial", "libraries"})) == "cases-libraries-trivial"
    assert cli.results_stem(None) == "latest"
    for argv in (["--cases", "no_such_case"], ["--cases", "input_1gb"],
                 ["--only", "pool", "--cases", "libraries"]):  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            cli._cases(parser.parse_args(argv), parser)
        assert exited.value.code == 2
    full = parser.parse_args(["--full", "--cases", "input_1gb"])
    assert cli._cases(full, parser) == {"input_1gb"}


async def test_real_workers_count_a_kernel_death_as_a_retirement(tmp_path: Path) -> None:
    failures: list[Failure] = []
    plan = LibraryPlan(warm_runs=2, reference_runs=1, budget_seconds=60.0)
    logs = tmp_path / "logs"
    async with (
        httpx.AsyncClient(timeout=60) as client,
        # another one-kernel worker of ours stands in for the reference
        one_kernel_worker(client, tmp_path, logs, "ref") as reference,
    ):
        result = await run_libraries(plan, client, tmp_path, logs, reference, failures,
                                     libraries=(KEPT, DIES))  # fmt: skip
    kept, dies = (result["libraries"][name] for name in ("json", "dies"))
    assert kept["ours"]["runs"] == 3 and kept["ours"]["retirements"] == {}
    assert kept["ours"]["same_kernel"] and kept["ours"]["same_module"]
    assert kept["reference"]["latency"]["count"] == 1 and kept["reference"]["problem"] is None
    assert kept["ratios"]["reference_vs_ours"] is not None
    assert dies["ours"]["runs"] == 0 and dies["ours"]["retirements"] == {"died": 1}
    assert dies["ours"]["problem"] == "HTTP 502"
    assert dies["reference"]["problem"] == "HTTP 502"  # a baseline's problem, not a failure
    assert [(f.target, f.case) for f in failures] == [("ours", "library_dies")]
    assert result["goal"]["retirements"] == 1 and result["goal"]["met"] is False
