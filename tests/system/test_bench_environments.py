"""The benchmark's environments case: its checks, arithmetic and table from plain data, and the
case run for real with a tiny plan (a lock, our worker on a fresh environment root, a first
request and a few warm cells; no reference)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest

from bench import cli
from bench.environments import (
    EnvironmentsPlan,
    Expected,
    answer_problem,
    find_python,
    run_environments,
)
from bench.environments_report import (
    environments_lines,
    environments_ratios,
    environments_targets,
)
from bench.errors import Failure


def test_the_case_is_selected_by_name_and_kept_apart_from_latest() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["--cases", "environments,trivial"])
    assert cli._cases(args, parser) == {"environments", "trivial"}
    assert cli.results_stem(frozenset({"environments"})) == "cases-environments"


def _manifest(result: Any, environment: dict[str, Any] | None = None) -> dict[str, Any]:
    manifest: dict[str, Any] = {"success": True, "variables": {"result": {"preview": result}}}
    if environment is not None:
        manifest["environment"] = environment
    return manifest


def test_an_answer_must_hold_the_value_and_name_the_environment_it_ran_in() -> None:
    built = {"key": "k", "installed": True}
    assert answer_problem(_manifest(12, built), Expected(12, installed=True)) is None
    assert "installed=False" in str(answer_problem(_manifest(12, built), Expected(12, False)))
    assert "expected 12" in str(answer_problem(_manifest(11, built), Expected(12, True)))
    # the default pool: no environment may be named
    assert answer_problem(_manifest(11), Expected(11, installed=None)) is None
    assert "none was asked" in str(answer_problem(_manifest(11, built), Expected(11, None)))
    # the reference's manifest does not carry it: only the value is checked
    assert answer_problem(_manifest(12), Expected(12, True, check_environment=False)) is None


def _results(ours_env: float | None, reference_first: float | None) -> dict[str, Any]:
    def series(p50: float | None, count: int) -> dict[str, Any]:
        return {"first": None, "latency": None if p50 is None else {"count": count, "p50": p50}}

    results: dict[str, Any] = {
        "package": "humanize",
        "python": "3.12",
        "reference": "started with a fresh STRATA_WORKER_ENV_ROOT",
        "first": {
            "ours": [{"seconds": 2.0, "build_seconds": 0.8}, {"seconds": 3.0}],
            "reference": [] if reference_first is None else [{"seconds": reference_first}],
        },
        "warm": {
            "ours_env": series(ours_env, 60),
            "ours_default": series(0.004, 60),
            "reference_env": series(0.2, 4),
        },
    }
    results["ratios"] = environments_ratios(results)
    return results


def test_ratios_goals_and_lines_side_by_side() -> None:
    results = _results(ours_env=0.005, reference_first=5.0)
    assert results["ratios"] == pytest.approx(
        {"first_reference_vs_ours": 2.0, "warm_env_vs_default": 1.25, "warm_reference_vs_env": 40}
    )
    assert [t["met"] for t in environments_targets(results)] == [True, True, True]
    lines = "\n".join(environments_lines(results))
    assert "2.50s" in lines and "5.00s" in lines  # the median of ours' two first requests
    assert "800.0ms" in lines and "40x r/o" in lines and "1.25x e/d" in lines
    # slower in the environment, a reference slower to start than us: both judged
    slow = _results(ours_env=0.008, reference_first=1.0)
    assert [t["met"] for t in environments_targets(slow)] == [False, False, True]
    assert "MISSED" in "\n".join(environments_lines(slow))


def test_what_did_not_run_gets_no_verdict() -> None:
    results = _results(ours_env=None, reference_first=None)
    assert [t["met"] for t in environments_targets(results)] == [None, None, None]
    assert "not run" in "\n".join(environments_lines(results))
    assert environments_lines(None) == [] and all(
        t["met"] is None for t in environments_targets(None)
    )
    assert environments_lines({"skipped": "needs Python 3.12"}) == [
        "ENVIRONMENTS: skipped (needs Python 3.12)"
    ]


@pytest.mark.timeout(300)
async def test_the_case_runs_on_our_worker(tmp_path: Path) -> None:
    """A real lock and a real worker: the first request builds, the warm cells run in the
    environment and on the default pool, and the worker is gone afterwards."""
    if find_python() is None:
        pytest.skip("no Python 3.12 on this machine")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    failures: list[Failure] = []
    plan = EnvironmentsPlan(firsts=1, cells=3, reference_cells=1, block=2, budget_seconds=120)
    results = await run_environments(plan, None, tmp_path, tmp_path / "logs", failures)
    assert failures == [], failures
    (first,) = results["first"]["ours"]
    assert first["seconds"] > 0 and first["build_seconds"] > 0
    assert results["first"]["reference"] == [] and "not run" in results["reference"]
    warm = results["warm"]
    assert warm["ours_env"]["latency"]["count"] == 3
    assert warm["ours_default"]["latency"]["count"] == 3
    assert results["ratios"]["warm_env_vs_default"] is not None
    assert results["ratios"]["first_reference_vs_ours"] is None
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
