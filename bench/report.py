"""The results: target verdicts and the compact text table printed at the end."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .stats import ratio

TARGET_ORDER = ("raw", "ours", "fresh", "reference")
TRANSFER_ORDER = ("raw", "http", "raw_plus_http", "ours", "fresh", "reference", "http_lean",
                  "raw_plus_http_lean", "ours_lean")  # fmt: skip
TRANSFER_HEADS = {
    "raw_plus_http": "raw+http",
    "http_lean": "http lean",
    "raw_plus_http_lean": "r+h lean",
    "ours_lean": "ours lean",
}


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1e-3:
        return f"{value * 1e6:.0f}us"
    if value < 0.01:
        return f"{value * 1e3:.2f}ms"
    if value < 1:
        return f"{value * 1e3:.1f}ms"
    return f"{value:.2f}s"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x" if value < 10 else f"{value:.0f}x"


def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def fmt_mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _get(tree: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return tree


# -- targets ------------------------------------------------------------------------------------


def _target(
    name: str, goal: str, value: float | None, ok: Callable[[float], bool]
) -> dict[str, Any]:
    return {
        "target": name,
        "goal": goal,
        "measured": value,
        "met": None if value is None else ok(value),
    }


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The goals from the issues, each judged on this run's medians (``met: None``: not run)."""
    pool = results.get("pool") or {}
    worker = results.get("worker") or {}
    ratios = pool.get("ratios_vs_floor") or {}

    def case_ratio(case: str, which: str) -> float | None:
        value: float | None = _get(worker, "cases", case, "ratios", which)
        return value

    def rate(case: str, target: str = "ours") -> float | None:
        value: float | None = _get(worker, "transfer", case, "mb_per_second", target)
        return value

    tput = _get(worker, "throughput", "4", "ours", "cells_per_second")
    growth = _get(worker, "memory", "growth", "ours") or {}
    large = _get(worker, "memory", "large_output") or {}
    above = _get(large, "ours", "server_above_mb")
    peak_gb = above / 1000 if above is not None and large.get("bytes", 0) >= 1000**3 else None
    return [
        _target("pool: lease + execute p50 vs raw floor", "<= 1.5x",
                ratios.get("lease_execute"), lambda v: v <= 1.5),
        _target("pool: full cycle incl. reset p50 vs raw floor", "<= 2x",
                ratios.get("full_cycle"), lambda v: v <= 2.0),
        _target("worker: trivial p50 vs raw kernel", "<= 1.5x",
                case_ratio("trivial", "ours_vs_raw"), lambda v: v <= 1.5),
        _target("worker: trivial, speed-up vs reference", ">= 50x",
                case_ratio("trivial", "reference_vs_ours"), lambda v: v >= 50),
        _target("worker: pandas + matplotlib, speed-up vs reference", ">= 100x",
                case_ratio("pandas_mpl", "reference_vs_ours"), lambda v: v >= 100),
        _target("worker: 10 MB input, speed-up vs reference", ">= 20x",
                case_ratio("input_10mb", "reference_vs_ours"), lambda v: v >= 20),
        _target("worker: 100 MB input, effective MB/s", ">= 500",
                rate("input_100mb"), lambda v: v >= 500),
        _target("worker: 100 MB output, effective MB/s", ">= 500",
                rate("output_100mb"), lambda v: v >= 500),
        _target("worker: 100 MB input, effective MB/s, lean client", ">= 500",
                rate("input_100mb", "ours_lean"), lambda v: v >= 500),
        _target("worker: 100 MB output, effective MB/s, lean client", ">= 500",
                rate("output_100mb", "ours_lean"), lambda v: v >= 500),
        _target("worker: throughput, 2 kernels, 4 clients (cells/s)", ">= 100",
                tput, lambda v: v >= 100),
        _target("worker: churn (--spares 1), others' p99/p50", "<= 5x",
                _get(worker, "churn", "series", "spares1", "p99_over_p50"), lambda v: v <= 5),
        _target("worker: RSS growth after warm-up, worker (%)", "< 5 %",
                _get(growth, "worker", "growth_percent"), lambda v: v < 5),
        _target("worker: RSS growth after warm-up, kernels (%)", "< 5 %",
                _get(growth, "kernels", "growth_percent"), lambda v: v < 5),
        _target("worker: 1 GB output, peak RSS above idle (GB, --full)", "< 1.5",
                peak_gb, lambda v: v < 1.5),
        _target("worker: libraries, kernel retirements (all libraries)", "0",
                _get(worker, "libraries", "goal", "retirements"), lambda v: v == 0),
    ]  # fmt: skip


# -- table --------------------------------------------------------------------------------------


def _pool_lines(pool: dict[str, Any]) -> list[str]:
    rows = [
        ("raw_execute", "raw jupyter_client execute (floor)", None),
        ("lease_execute", "lease + execute, kernel idle", "lease_execute"),
        ("full_cycle", "full cycle, 1 kernel, incl. reset", "full_cycle"),
        ("reset", "reset alone (pool stats)", None),
        ("replacement", "replacement: retire -> warm lease", None),
        ("kernel_start", "kernel start (pool stats)", None),
    ]
    lines = [f"{'POOL (kernel_pool, in process)':<36}{'n':>6}{'p50':>10}{'p95':>10}{'p99':>10}"
             f"{'vs floor':>10}  goal"]  # fmt: skip
    for key, label, ratio_key in rows:
        s = _get(pool, "cases", key) or {}
        r = _get(pool, "ratios_vs_floor", ratio_key) if ratio_key else None
        goal = _get(pool, "goals", ratio_key) if ratio_key else None
        lines.append(
            f"{label:<36}{s.get('count', 0):>6}{fmt_seconds(s.get('p50')):>10}"
            f"{fmt_seconds(s.get('p95')):>10}{fmt_seconds(s.get('p99')):>10}"
            f"{fmt_ratio(r) if ratio_key else '':>10}  {f'<= {goal:g}x' if goal else ''}"
        )
    tp = pool.get("throughput") or {}
    lines.append(
        f"throughput, {tp.get('kernels', '?')} kernels x {tp.get('callers', '?')} callers: "
        f"{fmt_rate(tp.get('leases_per_second'))} leases/s "
        f"({tp.get('leases', 0)} leases, p50 {fmt_seconds(_get(tp, 'latency', 'p50'))})"
    )
    return lines


def _worker_lines(worker: dict[str, Any]) -> list[str]:
    lines = _case_lines(worker.get("cases") or {})
    lines += _preload_lines(_get(worker, "cases", "preloaded_model"))
    for section in (_throughput_lines(worker.get("throughput") or {}),
                    _transfer_lines(worker.get("transfer") or {}), _churn_lines(worker.get("churn")),
                    _memory_lines(worker.get("memory")), _library_lines(worker.get("libraries"))):  # fmt: skip
        if section:
            lines += ["", *section] if lines else section
    return lines


def _case_lines(cases: dict[str, Any]) -> list[str]:
    if not cases:
        return []
    head = (f"{'WORKER (HTTP, p50 unless noted)':<27}{'raw':>9}{'http':>9}{'ours':>9}"
            f"{'ours p95':>10}{'ours p99':>10}{'1st ours':>10}{'fresh':>9}{'ref':>9}"
            f"{'ours/raw':>10}{'/(r+http)':>10}{'fresh/ours':>11}{'ref/ours':>10}")  # fmt: skip
    lines = [head]
    for name, case in cases.items():
        t = case.get("targets") or {}

        def p(target: str, q: str = "p50", t: dict[str, Any] = t) -> str:
            return fmt_seconds(_get(t, target, "latency", q))

        r = case.get("ratios") or {}
        lines.append(
            f"{case.get('label', name)[:26]:<27}{p('raw'):>9}{p('http'):>9}{p('ours'):>9}"
            f"{p('ours', 'p95'):>10}{p('ours', 'p99'):>10}{fmt_seconds(_get(t, 'ours', 'first')):>10}"
            f"{p('fresh'):>9}{p('reference'):>9}{fmt_ratio(r.get('ours_vs_raw')):>10}"
            f"{fmt_ratio(r.get('ours_vs_raw_plus_http')):>10}"
            f"{fmt_ratio(r.get('fresh_vs_ours')):>11}{fmt_ratio(r.get('reference_vs_ours')):>10}"
        )
    return lines


def _throughput_lines(levels: dict[str, Any]) -> list[str]:
    if not levels:
        return []
    lines = [f"{'THROUGHPUT trivial, cells/s':<29}" + "".join(f"{n:>11}" for n in TARGET_ORDER)
             + f"{'ours p50':>10}{'ours p99':>10}  ours CPU ms/cell: worker/kernels/client, busy"]  # fmt: skip
    for clients, level in levels.items():
        cells = "".join(f"{fmt_rate(_get(level, n, 'cells_per_second')):>11}" for n in TARGET_ORDER)
        lines.append(
            f"{f'{clients} client(s), 2 kernels':<29}{cells}"
            f"{fmt_seconds(_get(level, 'ours', 'latency', 'p50')):>10}"
            f"{fmt_seconds(_get(level, 'ours', 'latency', 'p99')):>10}  {_cpu_text(level.get('ours'))}"
        )
    return lines


def _preload_lines(case: dict[str, Any] | None) -> list[str]:
    """What fresh mode pays for a preload: back to back vs with its replacements ready."""
    if not case:
        return []
    t = case.get("targets") or {}

    def series(name: str) -> str:
        s = _get(t, name, "latency") or {}
        return (f"p50 {fmt_seconds(s.get('p50'))}, max {fmt_seconds(s.get('max'))} "
                f"(n={s.get('count', 0)})")  # fmt: skip

    back_to_back = fmt_ratio(_get(case, "ratios", "fresh_vs_ours"))
    paced = fmt_ratio(_get(case, "ratios", "fresh_paced_vs_ours"))
    return [
        f"  preloaded model, fresh mode back to back: {series('fresh')}, fresh/ours {back_to_back}",
        f"  preloaded model, fresh mode paced (every kernel idle before each request): "
        f"{series('fresh_paced')}, fresh/ours {paced}",
    ]


def _transfer_lines(transfer: dict[str, Any]) -> list[str]:
    if not transfer:
        return []
    heads = "".join(f"{TRANSFER_HEADS.get(n, n):>11}" for n in TRANSFER_ORDER)
    lines = [f"{'TRANSFER, MB/s (payload / p50)':<33}{heads}{'ours/ref':>10}  goal (ours)"]
    for item in transfer.values():
        rates = item.get("mb_per_second") or {}
        cells = "".join(f"{fmt_rate(rates.get(n)):>11}" for n in TRANSFER_ORDER)
        goal = ">= 500" if item.get("bytes") == 100 * 1000**2 else ""
        vs_ref = ratio(rates.get("ours"), rates.get("reference"))
        lines.append(f"{item.get('label', '?'):<33}{cells}{fmt_ratio(vs_ref):>10}  {goal}")
    return lines


_CHURN_LABELS = {
    "spares1": "ours --spares 1, back to back",
    "spares1_paced": "ours --spares 1, paced",
    "ours": "ours --spares 0, back to back",
    "fresh": "fresh, back to back",
    "reference": "reference, back to back",
}


def _churn_lines(churn: dict[str, Any] | None) -> list[str]:
    """p50/p95/p99/max of the cells that did not die, and of the one right after each death."""
    if not churn:
        return []
    every = churn.get("every", "?")
    lines = [f"{f'CHURN, every {every}th cell dies':<33}{'n':>6}{'kills':>6}{'status':>8}{'p50':>9}"
             f"{'p95':>9}{'p99':>9}{'max':>9}{'p99/p50':>9}{'next p50':>10}{'next max':>10}"]  # fmt: skip
    for name, item in (churn.get("series") or {}).items():
        s = item.get("latency") or {}
        after = item.get("after_kill") or {}
        statuses = "/".join(sorted(item.get("kill_statuses") or {})) or "-"
        label = _CHURN_LABELS.get(name, name)
        if item.get("pace_seconds"):
            label += f" {item['pace_seconds'] * 1e3:.0f} ms"
        lines.append(
            f"{label:<33}{s.get('count', 0):>6}{item.get('kills', 0):>6}{statuses:>8}"
            f"{fmt_seconds(s.get('p50')):>9}{fmt_seconds(s.get('p95')):>9}"
            f"{fmt_seconds(s.get('p99')):>9}{fmt_seconds(s.get('max')):>9}"
            f"{fmt_ratio(item.get('p99_over_p50')):>9}{fmt_seconds(after.get('p50')):>10}"
            f"{fmt_seconds(after.get('max')):>10}"
        )
    return lines


def _memory_lines(memory: dict[str, Any] | None) -> list[str]:
    if not memory:
        return []
    growth = memory.get("growth") or {}
    ours = growth.get("ours") or {}
    title = f"MEMORY, RSS in MB over {ours.get('cells', 0)} trivial cells"
    warm = f"at {ours.get('warmup', 0)}"
    lines = [f"{title:<40}{'start':>9}{warm:>9}{'end':>9}{'max':>9}{'growth':>9}  goal"]
    rows = [("ours", "worker", "ours: worker"), ("ours", "kernels", "ours: kernels (reset)"),
            ("raw", "kernels", "raw kernels (no reset)")]  # fmt: skip
    for target, role, label in rows:
        g = _get(growth, target, role) or {}
        pct = g.get("growth_percent")
        lines.append(
            f"{label:<40}{fmt_mb(g.get('start_mb')):>9}{fmt_mb(g.get('warm_mb')):>9}"
            f"{fmt_mb(g.get('end_mb')):>9}{fmt_mb(g.get('max_mb')):>9}"
            f"{'-' if pct is None else f'{pct:+.1f}%':>9}  {'< 5 %' if target == 'ours' else ''}"
        )
    large = memory.get("large_output") or {}
    for target in ("ours", "reference"):
        item = large.get(target) or {}
        if not item:
            continue
        who = "worker" if target == "ours" else "reference server"
        lines.append(
            f"output {fmt_mb(large.get('bytes', 0) / 1e6)} MB, {target}: peak {who} RSS "
            f"+{fmt_mb(item.get('server_above_mb'))} MB above idle "
            f"({fmt_ratio(item.get('server_above_per_output_byte'))} the payload, from "
            f"{item.get('server_peak_from')}); its children +{fmt_mb(item.get('children_above_mb'))} MB; "
            f"{fmt_seconds(item.get('seconds'))}"
        )
    return lines


def _library_lines(libraries: dict[str, Any] | None) -> list[str]:
    """Retirements and second-run latency per library, and the zero-retirements goal."""
    if not libraries:
        return []
    title = (f"LIBRARIES: retirements per library, second-run latency per library "
             f"(1 kernel each; warm = runs 2..{1 + libraries.get('warm_runs', 0)})")  # fmt: skip
    lines = [title, f"{'library':<20}{'runs':>5}{'retired':>8}{'kernel':>7}{'module':>7}{'1st':>9}"
             f"{'2nd':>9}{'warm p50':>9}{'1st/warm':>9}{'ref':>9}{'ref/ours':>9}"]  # fmt: skip
    not_run: dict[str, list[str]] = {}
    for name, entry in (libraries.get("libraries") or {}).items():
        ours, r = entry.get("ours") or {}, entry.get("ratios") or {}
        if entry.get("skipped") or ours.get("problem"):
            not_run.setdefault(f"ours: {entry.get('skipped') or ours['problem']}", []).append(name)
        ref = entry.get("reference") or {}
        if ref.get("problem"):
            not_run.setdefault(f"reference: {_reason(ref['problem'])}", []).append(name)
        lines.append(
            f"{name[:19]:<20}{ours.get('runs', 0):>5}{_retired(ours):>8}"
            f"{_same(ours.get('same_kernel')):>7}{_same(ours.get('same_module')):>7}"
            f"{fmt_seconds(ours.get('first')):>9}{fmt_seconds(ours.get('second')):>9}"
            f"{fmt_seconds(_get(ours, 'warm', 'p50')):>9}{fmt_ratio(r.get('first_vs_warm')):>9}"
            f"{fmt_seconds(_get(ref, 'latency', 'p50')):>9}{fmt_ratio(r.get('reference_vs_ours')):>9}"
        )
    for reason, names in not_run.items():
        lines.append(f"  not measured, {reason}: {', '.join(names)}")
    return [*lines, _library_goal_line(libraries.get("goal") or {})]


def _retired(ours: dict[str, Any]) -> str:
    if "retired" not in ours:
        return "-"
    reasons = ",".join(f"{reason} {count}" for reason, count in ours["retirements"].items())
    return f"{ours['retired']}" + (f" ({reasons})" if reasons else "")


def _same(value: bool | None) -> str:
    return {True: "same", False: "NEW", None: "-"}[value]


_NO_MODULE = re.compile(r"No module named '?([\w.]+)")


def _reason(problem: str) -> str:
    """A baseline's failure in a few words (its environment lacks a library, mostly)."""
    if _NO_MODULE.search(problem):
        return "not installed in its environment"
    return problem.removeprefix("success=False error=")[:100]


def _library_goal_line(goal: dict[str, Any]) -> str:
    total = goal.get("retirements")
    verdict = {True: "met", False: "MISSED", None: "not run"}[goal.get("met")]
    line = (f"  goal, zero retirements: {verdict} ({'-' if total is None else total} over "
            f"{goal.get('libraries', 0)} libraries, {goal.get('runs', 0)} runs")  # fmt: skip
    if goal.get("retired_libraries"):
        line += f"; kernel lost by: {', '.join(goal['retired_libraries'])}"
    if goal.get("modules_reimported"):
        line += f"; imported again: {', '.join(goal['modules_reimported'])}"
    return line + ")"


def _cpu_text(result: dict[str, Any] | None) -> str:
    per_cell = _get(result, "cpu_seconds_per_cell") or {}
    if not per_cell:
        return "-"
    parts = "/".join(
        f"{per_cell.get(role, 0.0) * 1e3:.1f}" for role in ("server", "kernels", "client")
    )
    return f"{parts}, {(_get(result, 'cpu_utilization') or 0.0) * 100:.0f}%"


def _load_lines(meta: dict[str, Any]) -> list[str]:
    cpus = meta.get("cpus") or 1
    loads = [meta.get("load_before"), meta.get("load_after")]
    if any(load and load[0] > cpus for load in loads):
        return [f"WARNING: the machine was busy with other work (1-min load {loads[0]} -> "
                f"{loads[1]} on {cpus} cores); numbers are pessimistic", ""]  # fmt: skip
    return []


def _target_lines(targets: list[dict[str, Any]]) -> list[str]:
    lines = ["TARGETS"]
    for t in targets:
        verdict = {True: "met", False: "MISSED", None: "not run"}[t["met"]]
        value = t["measured"]
        shown = "-" if value is None else f"{value:.2f}"
        lines.append(f"  [{verdict:<7}] {t['target']:<55} goal {t['goal']:<8} measured {shown}")
    return lines


def _failure_lines(failures: list[dict[str, Any]]) -> list[str]:
    if not failures:
        return []
    lines = ["FAILURES (request and response as sent/received; not retried)"]
    for f in failures:
        lines.append(f"  {f['level']}/{f['target']}/{f['case']}: status {f['status']}")
        lines.append(f"    request:  {f['request'][:400]}")
        lines.append("    response: " + f["response"][:1200].replace("\n", "\n              "))
    return lines


def render_table(results: dict[str, Any]) -> str:
    lines: list[str] = _load_lines(results.get("meta") or {})
    if results.get("pool"):
        lines += [*_pool_lines(results["pool"]), ""]
    if results.get("worker"):
        lines += [*_worker_lines(results["worker"]), ""]
    targets = results.get("targets") or []
    if _get(results, "meta", "cases"):  # a selection: the targets it did not measure are noise
        targets = [t for t in targets if t["met"] is not None]
    lines += _target_lines(targets)
    lines += _failure_lines(results.get("failures") or [])
    return "\n".join(lines)
