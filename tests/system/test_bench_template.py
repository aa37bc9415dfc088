"""The benchmark's template case: its preload, its arithmetic and table from plain data, and one
small template pool measured for real (a worker over HTTP on loopback, a kernel SIGKILLed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest

from bench import cli
from bench.errors import Failure
from bench.template import Context, TemplatePlan, memory_totals, preload_source, read_runs, run_pool
from bench.template_report import template_lines, template_ratios, template_targets

GB = 10**9


def test_the_case_is_selected_by_name_and_kept_apart_from_latest() -> None:
    parser = cli.build_parser()
    assert cli._cases(parser.parse_args(["--cases", "template,trivial"]), parser) == {
        "template",
        "trivial",
    }
    assert cli.results_stem(frozenset({"template"})) == "cases-template"


def test_the_preload_builds_the_model_and_records_each_run(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    source = preload_source(64, 0.0, runs)
    for _ in range(2):
        namespace: dict[str, Any] = {}
        exec(compile(source, "preload.py", "exec"), namespace)
        assert np.array_equal(namespace["model"], np.ones(8))
        assert not {"_started", "_fh"} & set(namespace)  # only the model stays, and imports
    found = read_runs(runs.read_text())
    assert found["runs"] == 2 and found["processes"] == 1
    assert found["seconds_p50"] is not None and found["seconds_p50"] >= 0
    assert read_runs("") == {"runs": 0, "processes": 0, "seconds_p50": None}


def test_memory_adds_the_template_to_the_kernels_and_a_spawned_pool_has_none() -> None:
    kernel = {"rss": 300, "pss": 100, "uss": 50}
    forked = {"pool": {"memory": {"template": {"rss": 2000, "pss": 1000, "uss": 900},
                                  "kernels": {"k1": kernel, "k2": kernel}}}}  # fmt: skip
    assert memory_totals(forked) == {"kernels": 2, "template_pss": 1000, "kernels_pss": 200,
                                     "pss_total": 1200, "rss_total": 2600}  # fmt: skip
    spawned = {"pool": {"memory": {"template": None, "kernels": {"k1": kernel}}}}
    assert memory_totals(spawned)["pss_total"] == 100
    assert memory_totals(spawned)["template_pss"] is None


def _pool(
    ready: float, pss: float, replacement: float | None, runs: int, seconds: float
) -> dict[str, Any]:
    return {
        "kernels": 4,
        "ready_seconds": ready,
        "memory": {"pss_total": pss, "rss_total": pss * 2},
        "replacement": None if replacement is None else {"count": 2, "p50": replacement, "max": replacement},
        "preload": {"runs": runs, "processes": runs, "seconds_p50": seconds},
    }  # fmt: skip


def _results(fresh_p50: float) -> dict[str, Any]:
    series = {
        "reset": {"latency": {"count": 60, "p50": 0.005}},
        "fresh": {"latency": {"count": 60, "p50": fresh_p50}},
        "reset_paced": {"latency": {"count": 20, "p50": 0.010}},
        "fresh_paced": {"latency": {"count": 20, "p50": 0.015}},
    }
    results: dict[str, Any] = {
        "model_bytes": 2 * GB,
        "load_seconds": 5.0,
        "pools": {
            "one_preload": _pool(7.0, 2.1 * GB, None, 1, 6.0),  # a kernel start: 1 s
            "per_kernel": _pool(14.0, 8.4 * GB, 6.5, 6, 10.0),
            "template": _pool(6.0, 2.2 * GB, 0.1, 1, 5.0),
        },
        "recycle": {
            "model_bytes": 200 * 2**20,
            "kernels": 2,
            "spares": 2,
            "pace_seconds": 0.2,
            "series": series,
        },
    }
    results["ratios"] = template_ratios(results)
    return results


def test_the_ratios_are_against_one_preload_plus_a_kernel_start_and_one_model() -> None:
    r = _results(fresh_p50=0.020)["ratios"]
    assert r["one_preload"] == {"preload_seconds": 5.0, "kernel_start_seconds": 1.0, "seconds": 6.0}
    assert r["start_vs_one_preload"] == pytest.approx({"per_kernel": 14.0 / 6.0, "template": 1.0})
    assert r["pss_vs_model"] == pytest.approx({"per_kernel": 4.2, "template": 1.1})
    assert r["per_kernel_vs_template"]["replacement"] == pytest.approx(65.0)
    assert r["fresh_vs_reset"] == pytest.approx({"back_to_back": 4.0, "paced": 1.5})


def test_each_goal_is_judged_and_printed_with_its_verdict() -> None:
    results = _results(fresh_p50=0.020)
    verdicts = {t["target"]: t["met"] for t in template_targets(results)}
    assert list(verdicts.values()) == [True, True, True, False, True]
    lines = "\n".join(template_lines(results))
    assert "<= 0.2s met" in lines and "<= 2x   MISSED" in lines
    assert "(5.00s + 1.00s)" in lines and "4.00x" in lines and "65x" in lines
    # a part that did not run: no verdict invented for it
    del results["pools"]["template"]
    results["ratios"] = template_ratios(results)
    targets = template_targets(results)
    assert [t["met"] for t in targets[:3]] == [None, None, None]
    assert "not run" in "\n".join(template_lines(results))
    assert template_lines(None) == [] and all(t["met"] is None for t in template_targets(None))


async def test_a_template_pool_is_measured_over_http(tmp_path: Path) -> None:
    """Two forks of a template with a 1 MiB model: the preload ran once, in a process that
    is not a kernel; a SIGKILLed kernel was replaced without running it again."""
    plan = TemplatePlan(model_bytes=2**20, load_seconds=0.0, kernels=2, replacements=1,
                        budget_seconds=60.0)  # fmt: skip
    failures: list[Failure] = []
    async with httpx.AsyncClient(timeout=30.0) as client:
        pool = await run_pool(Context(client, tmp_path, tmp_path / "logs", failures), plan,
                              "template")  # fmt: skip
    assert failures == []
    assert pool["kernel_start"] == "fork" and pool["ready_seconds"] > 0
    assert pool["preload"]["runs"] == 1  # after the pool's start and one replacement
    assert pool["replacement"]["count"] == 1
    assert pool["replacement_start"]["count"] == 1  # the pool's own timing, from /metrics
    memory = pool["memory"]
    assert memory["kernels"] == 2 and memory["template_pss"] > 2**20
    assert memory["pss_total"] > memory["template_pss"]
    (template_pid,) = {
        int(line.split()[0])
        for line in (tmp_path / "template-template.runs").read_text().splitlines()
    }
    assert not psutil.pid_exists(template_pid)  # stopped with its worker
