"""The environments case's verdicts: its ratios, its goals and its lines of the printed table.

From what :mod:`bench.environments` measured: the first request in a new environment, the
reference's over ours (goal: ours no slower, at least 1x); a warm cell in the environment
against the same cell on our default pool (at most 1.5x) and the reference's cached
environment over ours (at least 5x); each judged ``met``, ``MISSED`` or ``not run``.
"""

from __future__ import annotations

import statistics
from typing import Any

from .report import fmt_ratio, fmt_seconds
from .stats import ratio

GOALS = {"first": 1.0, "env_vs_default": 1.5, "reference_vs_env": 5.0}
VERDICTS = {True: "met", False: "MISSED", None: "not run"}


def _get(tree: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return tree


def first_seconds(results: dict[str, Any], name: str) -> float | None:
    """The median of a worker's first requests (one per fresh environment root)."""
    seconds = [entry["seconds"] for entry in _get(results, "first", name) or []]
    return statistics.median(seconds) if seconds else None


def environments_ratios(results: dict[str, Any]) -> dict[str, float | None]:
    warm = results.get("warm") or {}

    def p50(name: str) -> float | None:
        value: float | None = _get(warm, name, "latency", "p50")
        return value

    return {
        "first_reference_vs_ours": ratio(first_seconds(results, "reference"),
                                         first_seconds(results, "ours")),
        "warm_env_vs_default": ratio(p50("ours_env"), p50("ours_default")),
        "warm_reference_vs_env": ratio(p50("reference_env"), p50("ours_env")),
    }  # fmt: skip


def _target(name: str, goal: str, value: float | None, met: bool | None) -> dict[str, Any]:
    return {"target": name, "goal": goal, "measured": value, "met": met}


def _at_least(value: float | None, limit: float) -> bool | None:
    return None if value is None else value >= limit


def _at_most(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def environments_targets(results: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The issue's goals for locked environments, judged on this run (``met: None``: not run)."""
    r = (results or {}).get("ratios") or {}
    first, default, reference = (r.get("first_reference_vs_ours"), r.get("warm_env_vs_default"),
                                 r.get("warm_reference_vs_env"))  # fmt: skip
    return [
        _target("environments: first request, reference vs ours", ">= 1x",
                first, _at_least(first, GOALS["first"])),
        _target("environments: warm cell in the environment vs the default pool", "<= 1.5x",
                default, _at_most(default, GOALS["env_vs_default"])),
        _target("environments: warm cell, reference's cached environment vs ours", ">= 5x",
                reference, _at_least(reference, GOALS["reference_vs_env"])),
    ]  # fmt: skip


def _row(label: str, *cells: str) -> str:
    return (f"{label:<46}" + "".join(f"{cell:>14}" for cell in cells)).rstrip()


def _warm_cell(warm: dict[str, Any], name: str) -> str:
    summary = _get(warm, name, "latency") or {}
    return f"{fmt_seconds(summary.get('p50'))} n={summary.get('count', 0)}"


def environments_lines(results: dict[str, Any] | None) -> list[str]:
    """The case's section of the printed table: ours and the reference side by side."""
    if not results:
        return []
    if results.get("skipped"):
        return [f"ENVIRONMENTS: skipped ({results['skipped']})"]
    r = results.get("ratios") or {}
    warm = results.get("warm") or {}
    firsts = [fmt_seconds(first_seconds(results, name)) for name in ("ours", "reference")]
    builds = [entry.get("build_seconds") for entry in _get(results, "first", "ours") or []]
    build = statistics.median([b for b in builds if b is not None]) if any(builds) else None
    n = len(_get(results, "first", "ours") or [])

    def verdict(goal: str, met: bool | None) -> str:
        return f"{goal} {VERDICTS[met]}"

    first = r.get("first_reference_vs_ours")
    default, reference = r.get("warm_env_vs_default"), r.get("warm_reference_vs_env")
    return [
        _row(f"ENVIRONMENTS: uv lock of {results.get('package')}, Python {results.get('python')}",
             "ours", "reference", "ratio", "goal"),
        _row(f"first request, fresh env root, p50 of {n}", *firsts,
             f"{fmt_ratio(first)} r/o", verdict(">= 1x", _at_least(first, GOALS["first"]))),
        _row("  of which ours built with uv (its own timing)", fmt_seconds(build)),
        _row("warm cell in the environment, p50", _warm_cell(warm, "ours_env"),
             _warm_cell(warm, "reference_env"), f"{fmt_ratio(reference)} r/o",
             verdict(">= 5x", _at_least(reference, GOALS["reference_vs_env"]))),
        _row("  the same cell on our default pool, p50", _warm_cell(warm, "ours_default"), "",
             f"{fmt_ratio(default)} e/d",
             verdict("<= 1.5x", _at_most(default, GOALS["env_vs_default"]))),
        f"  reference: {results.get('reference')}",
    ]  # fmt: skip
