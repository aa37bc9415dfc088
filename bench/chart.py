"""``latest.png``: latency by case (ours vs its baselines), throughput, the pool floor, churn
(p50 with a whisker to p99) and RSS over many cells."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {
    "raw": "#7f7f7f",
    "http": "#c7c7c7",
    "ours": "#1f77b4",
    "kernel_pool": "#1f77b4",
    "fresh": "#ff7f0e",
    "fresh_paced": "#ffbb78",
    "reference": "#d62728",
}
TARGETS = ("raw", "http", "ours", "fresh", "fresh_paced", "reference")
THROUGHPUT_TARGETS = ("raw", "ours", "fresh", "reference")
POOL_CASES = ("raw_execute", "lease_execute", "full_cycle", "reset", "replacement")


def _value(tree: Any, *path: str) -> float | None:
    for key in path:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return float(tree) if isinstance(tree, int | float) else None


def _grouped(ax: Any, labels: list[str], series: dict[str, list[tuple[float, float]]]) -> None:
    """Bars at p50 with a whisker up to p95 (or p99), one group per label, log scale."""
    series = {name: points for name, points in series.items() if any(p50 for p50, _ in points)}
    if not series:
        ax.set_axis_off()
        return
    width = 0.8 / max(1, len(series))
    for i, (name, points) in enumerate(series.items()):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
        heights = [p50 for p50, _ in points]
        upper = [max(0.0, p95 - p50) for p50, p95 in points]
        yerr = [[0.0] * len(points), upper] if any(upper) else None
        ax.bar(xs, heights, width, label=name, color=COLORS.get(name), yerr=yerr, capsize=2)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)


def _latency_series(
    worker: dict[str, Any],
) -> tuple[list[str], dict[str, list[tuple[float, float]]]]:
    cases = worker.get("cases") or {}
    labels = [c.get("label", n) for n, c in cases.items()]
    series: dict[str, list[tuple[float, float]]] = {}
    for target in TARGETS:
        points = []
        for case in cases.values():
            p50 = _value(case, "targets", target, "latency", "p50")
            p95 = _value(case, "targets", target, "latency", "p95")
            points.append((p50 or 0.0, p95 or p50 or 0.0))
        if any(p50 for p50, _ in points):
            series[target] = points
    return labels, series


def _churn(ax: Any, churn: dict[str, Any]) -> None:
    items = churn.get("series") or {}
    points = [
        (_value(item, "latency", "p50") or 0.0, _value(item, "latency", "p99") or 0.0)
        for item in items.values()
    ]
    _grouped(ax, list(items), {"p50, whisker to p99": points})
    for x, item in enumerate(items.values()):
        p99_over_p50 = _value(item, "p99_over_p50")
        if p99_over_p50 is not None:
            label = f"p99/p50 {p99_over_p50:.1f}x"
            ax.annotate(label, (x, max(points[x])), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("seconds per surviving cell")
    ax.set_title(f"Churn: every {churn.get('every', '?')}th cell kills its kernel")


def _memory(ax: Any, memory: dict[str, Any]) -> None:
    """RSS relative to its value after the warm-up (the growth the target judges), in %."""
    growth = memory.get("growth") or {}
    for target, role, style in (("ours", "worker", "-"), ("ours", "kernels", "--"),
                                ("raw", "kernels", ":")):  # fmt: skip
        points = [p for p in (growth.get(target) or {}).get("points") or [] if role in p]
        warm = _value(growth, target, role, "warm_mb")
        if points and warm:
            xs = [p["cells"] for p in points]
            ys = [(p[role] / warm - 1) * 100 for p in points]
            ax.plot(xs, ys, style, color=COLORS[target], label=f"{target}: {role} ({warm:.0f} MB)")
    if not ax.lines:
        ax.set_axis_off()
        return
    ax.axhline(5.0, color="#d62728", linewidth=0.8, linestyle="-.", label="goal: < +5 %")
    ax.axvline(float(_value(growth, "ours", "warmup") or 0), color="#7f7f7f", linewidth=0.8)
    ax.set_xlabel("trivial cells (vertical line: end of warm-up)")
    ax.set_ylabel("RSS vs after warm-up (%)")
    title = "RSS over many cells (kernels summed)"
    large = memory.get("large_output") or {}
    above = _value(large, "ours", "server_above_mb")
    if above is not None:
        title += f"\n{large.get('bytes', 0) / 1e6:.0f} MB output: worker peak +{above:.0f} MB"
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def write_chart(results: dict[str, Any], path: Path) -> None:
    """Render with the Agg backend (blocking: call outside the event loop or in a thread)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplot_mosaic(
        [["latency", "latency", "throughput"], ["pool", "churn", "memory"]], figsize=(20, 13)
    )
    worker = results.get("worker") or {}
    labels, series = _latency_series(worker)
    _grouped(axes["latency"], labels, series)
    axes["latency"].set_ylabel("seconds per cell (p50, whisker to p95)")
    axes["latency"].set_title(
        "Worker latency by case (raw = same cell on a bare kernel; http = same bytes, no kernel)"
    )

    levels = worker.get("throughput") or {}
    tput: dict[str, list[tuple[float, float]]] = {}
    for target in THROUGHPUT_TARGETS:
        values = [_value(level, target, "cells_per_second") or 0.0 for level in levels.values()]
        if any(values):
            tput[target] = [(v, v) for v in values]
    _grouped(axes["throughput"], [f"{c} clients" for c in levels], tput)
    axes["throughput"].set_ylabel("cells / second (trivial cell, 2 kernels)")
    axes["throughput"].set_title("Throughput")

    pool = results.get("pool") or {}
    pool_points = [
        (_value(pool, "cases", c, "p50") or 0.0, _value(pool, "cases", c, "p95") or 0.0)
        for c in POOL_CASES
    ]
    _grouped(axes["pool"], list(POOL_CASES), {"kernel_pool": pool_points})
    axes["pool"].set_ylabel("seconds (p50, whisker to p95)")
    axes["pool"].set_title("Pool level (raw_execute = floor)")
    _churn(axes["churn"], worker.get("churn") or {})
    _memory(axes["memory"], worker.get("memory") or {})

    fig.suptitle(f"strata-kernel-worker benchmark ({results.get('meta', {}).get('mode', '')})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
