"""The template case's verdicts: its ratios, its goals and its lines of the printed table.

From the results :mod:`bench.template` measured: each pool's start against one preload plus
a kernel start, its PSS against the model's bytes, the replacements, per-kernel over
template, and fresh over reset, each goal judged as ``met``, ``MISSED`` or ``not run``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .report import fmt_ratio, fmt_seconds
from .stats import ratio

GIB = 2**30
MIB = 2**20
GOALS = {"start": 1.2, "pss": 1.2, "replacement_seconds": 0.2, "fresh_vs_reset": 2.0}
VERDICTS = {True: "met", False: "MISSED", None: "not run"}


def _get(tree: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return tree


def start_yardstick(pools: dict[str, Any]) -> dict[str, float | None]:
    """One preload plus a kernel start, in seconds: the preload's own time where it ran once,
    in the template (so a slow fill of the model's pages in that run counts on both sides),
    and the one-kernel worker's start less its own preload's time."""
    preload = _get(pools, "template", "preload", "seconds_p50")
    one_ready = _get(pools, "one_preload", "ready_seconds")
    one_preload = _get(pools, "one_preload", "preload", "seconds_p50")
    start = None if one_ready is None or one_preload is None else max(0.0, one_ready - one_preload)
    total = None if preload is None or start is None else preload + start
    return {"preload_seconds": preload, "kernel_start_seconds": start, "seconds": total}


def template_ratios(results: dict[str, Any]) -> dict[str, Any]:
    """Each pool against one preload and one model; per-kernel over template; fresh over reset."""
    pools = results.get("pools") or {}
    one = start_yardstick(pools)
    model = results.get("model_bytes")

    def by_pool(*path: str, over: float | None = None) -> dict[str, float | None]:
        values = {name: _get(pools, name, *path) for name in ("per_kernel", "template")}
        return {name: ratio(v, over) if over is not None else v for name, v in values.items()}

    start = by_pool("ready_seconds")
    pss = by_pool("memory", "pss_total")
    replacement = by_pool("replacement", "p50")
    series = _get(results, "recycle", "series") or {}

    def fresh_over_reset(suffix: str) -> float | None:
        return ratio(_get(series, f"fresh{suffix}", "latency", "p50"),
                     _get(series, f"reset{suffix}", "latency", "p50"))  # fmt: skip

    return {
        "one_preload": one,
        "start_vs_one_preload": by_pool("ready_seconds", over=one["seconds"]),
        "pss_vs_model": by_pool("memory", "pss_total", over=model),
        "replacement_p50_seconds": replacement,
        "per_kernel_vs_template": {
            "start": ratio(start["per_kernel"], start["template"]),
            "pss": ratio(pss["per_kernel"], pss["template"]),
            "replacement": ratio(replacement["per_kernel"], replacement["template"]),
        },
        "fresh_vs_reset": {
            "back_to_back": fresh_over_reset(""),
            "paced": fresh_over_reset("_paced"),
        },
    }


def _target(name: str, goal: str, value: float | None, limit: float) -> dict[str, Any]:
    return {"target": name, "goal": goal, "measured": value,
            "met": None if value is None else value <= limit}  # fmt: skip


def template_targets(results: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The issue's goals for the template, judged on this run (``met: None``: not run)."""
    r = (results or {}).get("ratios") or {}
    kernels = _get(results, "pools", "template", "kernels") or 4
    fresh = _get(r, "fresh_vs_reset") or {}
    return [
        _target(f"template: pool of {kernels} ready vs one preload", "<= 1.2x",
                _get(r, "start_vs_one_preload", "template"), GOALS["start"]),
        _target("template: total PSS (kernels + template) vs one model", "<= 1.2x",
                _get(r, "pss_vs_model", "template"), GOALS["pss"]),
        _target("template: replacement after SIGKILL, p50 (s)", "<= 0.2",
                _get(r, "replacement_p50_seconds", "template"), GOALS["replacement_seconds"]),
        _target("template: fresh (spares) vs reset p50, back to back", "<= 2x",
                fresh.get("back_to_back"), GOALS["fresh_vs_reset"]),
        _target("template: fresh (spares) vs reset p50, paced", "<= 2x",
                fresh.get("paced"), GOALS["fresh_vs_reset"]),
    ]  # fmt: skip


def _size(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f} GiB" if nbytes >= GIB else f"{nbytes / MIB:.0f} MiB"


def _gb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.2f}"


def _verdict(goal: str, value: float | None, limit: float) -> str:
    met = None if value is None else value <= limit
    return f"{goal:<8}{VERDICTS[met]}"


def _row(label: str, left: str, right: str, ratio_text: str = "", goal: str = "") -> str:
    return f"{label:<52}{left:>19}{right:>19}{ratio_text:>12}  {goal}".rstrip()


def template_lines(results: dict[str, Any] | None) -> list[str]:
    """The case's section of the printed table: per-kernel and template side by side."""
    if not results:
        return []
    pools = results.get("pools") or {}
    r = results.get("ratios") or {}
    per, tmpl = pools.get("per_kernel") or {}, pools.get("template") or {}
    model = results.get("model_bytes") or 0
    kernels = tmpl.get("kernels") or per.get("kernels") or "?"

    def both(*path: str, fmt: Callable[[Any], str] = fmt_ratio) -> tuple[str, str]:
        return fmt(_get(per, *path)), fmt(_get(tmpl, *path))

    def replaced(pool: dict[str, Any], key: str = "replacement") -> str:
        s = pool.get(key) or {}
        return f"{fmt_seconds(s.get('p50'))} ({fmt_seconds(s.get('max'))})"

    start, pss = _get(r, "start_vs_one_preload") or {}, _get(r, "pss_vs_model") or {}
    speed = _get(r, "per_kernel_vs_template") or {}
    counts = (_get(pool, "replacement", "count") or 0 for pool in (per, tmpl))
    title = f"TEMPLATE: preload {_size(model)} NumPy model + {results.get('load_seconds', 0):g} s"
    one = _get(r, "one_preload") or {}
    yardstick = f"{fmt_seconds(one.get('preload_seconds'))} + {fmt_seconds(one.get('kernel_start_seconds'))}"
    lines = [
        _row(title, "per-kernel", "template", "per-k/tmpl", "goal (template)"),
        _row(f"pool of {kernels} ready: launch -> /ready, all idle",
             *both("ready_seconds", fmt=fmt_seconds), fmt_ratio(speed.get("start"))),
        _row(f"  vs one preload + a kernel start ({yardstick})",
             fmt_ratio(start.get("per_kernel")), fmt_ratio(start.get("template")), "",
             _verdict("<= 1.2x", start.get("template"), GOALS["start"])),
        _row("total PSS, kernels + template (GB)", *both("memory", "pss_total", fmt=_gb),
             fmt_ratio(speed.get("pss"))),
        _row(f"  vs one model ({model / 1e9:.2f} GB)", fmt_ratio(pss.get("per_kernel")),
             fmt_ratio(pss.get("template")), "",
             _verdict("<= 1.2x", pss.get("template"), GOALS["pss"])),
        _row("total RSS, kernels + template (GB)", *both("memory", "rss_total", fmt=_gb)),
        _row(f"replacement after SIGKILL, p50 (max), n={'/'.join(map(str, counts))}",
             replaced(per), replaced(tmpl),
             fmt_ratio(speed.get("replacement")),
             _verdict("<= 0.2s", _get(tmpl, "replacement", "p50"), GOALS["replacement_seconds"])),
        _row("  its start as the pool timed it (/metrics)", replaced(per, "replacement_start"),
             replaced(tmpl, "replacement_start")),
        _row("preload runs (start + replacements)", *both("preload", "runs", fmt=_count)),
        _row("preload seconds where it ran, p50", *both("preload", "seconds_p50", fmt=fmt_seconds)),
    ]  # fmt: skip
    return lines + _recycle_lines(results.get("recycle"), _get(r, "fresh_vs_reset") or {})


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _recycle_lines(recycle: dict[str, Any] | None, ratios: dict[str, Any]) -> list[str]:
    if not recycle:
        return []
    series = recycle.get("series") or {}
    title = f"FRESH vs RESET: template, {_size(recycle.get('model_bytes', 0))} model, pool {recycle.get('kernels')}"
    lines = [_row(title, "reset", f"fresh, {recycle.get('spares')} spares", "fresh/reset", "goal")]
    pace = recycle.get("pace_seconds") or 0
    for suffix, label in (("", "back to back"), ("_paced", f"paced, {pace * 1e3:.0f} ms apart")):
        count = _get(series, f"fresh{suffix}", "latency", "count") or 0
        value = ratios.get("back_to_back" if not suffix else "paced")
        lines.append(_row(
            f"  trivial cell p50, {label} (n={count})",
            fmt_seconds(_get(series, f"reset{suffix}", "latency", "p50")),
            fmt_seconds(_get(series, f"fresh{suffix}", "latency", "p50")),
            fmt_ratio(value), _verdict("<= 2x", value, GOALS["fresh_vs_reset"]),
        ))  # fmt: skip
    return lines
