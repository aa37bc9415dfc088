"""The results: target verdicts and the compact text table printed at the end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TARGET_ORDER = ("raw", "ours", "fresh", "reference")


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

    tput = _get(worker, "throughput", "4", "ours", "cells_per_second")
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
        _target("worker: throughput, 2 kernels, 4 clients (cells/s)", ">= 100",
                tput, lambda v: v >= 100),
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
    head = (f"{'WORKER (HTTP, p50 unless noted)':<27}{'raw':>9}{'ours':>9}{'ours p95':>10}"
            f"{'ours p99':>10}{'1st ours':>10}{'fresh':>9}{'ref':>9}"
            f"{'ours/raw':>10}{'fresh/ours':>11}{'ref/ours':>10}")  # fmt: skip
    lines = [head]
    for name, case in (worker.get("cases") or {}).items():
        t = case.get("targets") or {}

        def p(target: str, q: str = "p50", t: dict[str, Any] = t) -> str:
            return fmt_seconds(_get(t, target, "latency", q))

        r = case.get("ratios") or {}
        lines.append(
            f"{case.get('label', name)[:26]:<27}{p('raw'):>9}{p('ours'):>9}{p('ours', 'p95'):>10}"
            f"{p('ours', 'p99'):>10}{fmt_seconds(_get(t, 'ours', 'first')):>10}"
            f"{p('fresh'):>9}{p('reference'):>9}{fmt_ratio(r.get('ours_vs_raw')):>10}"
            f"{fmt_ratio(r.get('fresh_vs_ours')):>11}{fmt_ratio(r.get('reference_vs_ours')):>10}"
        )
    lines.append("")
    lines.append(f"{'THROUGHPUT trivial, cells/s':<29}" + "".join(f"{n:>11}" for n in TARGET_ORDER)
                 + f"{'ours p50':>10}{'ours p99':>10}  ours CPU ms/cell: worker/kernels/client, busy")  # fmt: skip
    for clients, level in (worker.get("throughput") or {}).items():
        cells = "".join(f"{fmt_rate(_get(level, n, 'cells_per_second')):>11}" for n in TARGET_ORDER)
        lines.append(
            f"{f'{clients} client(s), 2 kernels':<29}{cells}"
            f"{fmt_seconds(_get(level, 'ours', 'latency', 'p50')):>10}"
            f"{fmt_seconds(_get(level, 'ours', 'latency', 'p99')):>10}  {_cpu_text(level.get('ours'))}"
        )
    return lines


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
        lines.append(f"  [{verdict:<7}] {t['target']:<52} goal {t['goal']:<8} measured {shown}")
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
    lines += _target_lines(results.get("targets") or [])
    lines += _failure_lines(results.get("failures") or [])
    return "\n".join(lines)
