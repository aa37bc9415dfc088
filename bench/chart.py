"""``latest.png``: latency by case (ours vs its baselines), throughput, and the pool floor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {
    "raw": "#7f7f7f",
    "ours": "#1f77b4",
    "kernel_pool": "#1f77b4",
    "fresh": "#ff7f0e",
    "reference": "#d62728",
}
TARGETS = ("raw", "ours", "fresh", "reference")
POOL_CASES = ("raw_execute", "lease_execute", "full_cycle", "reset", "replacement")


def _value(tree: Any, *path: str) -> float | None:
    for key in path:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return float(tree) if isinstance(tree, int | float) else None


def _grouped(ax: Any, labels: list[str], series: dict[str, list[tuple[float, float]]]) -> None:
    """Bars at p50 with a whisker up to p95, one group per label, log scale."""
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


def write_chart(results: dict[str, Any], path: Path) -> None:
    """Render with the Agg backend (blocking: call outside the event loop or in a thread)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(20, 6.5), gridspec_kw={"width_ratios": [3, 1.2, 1.4]})
    worker = results.get("worker") or {}
    labels, series = _latency_series(worker)
    _grouped(axes[0], labels, series)
    axes[0].set_ylabel("seconds per cell (p50, whisker to p95)")
    axes[0].set_title("Worker latency by case (HTTP; raw = same cell on a bare kernel)")

    levels = worker.get("throughput") or {}
    tput: dict[str, list[tuple[float, float]]] = {}
    for target in TARGETS:
        values = [_value(level, target, "cells_per_second") or 0.0 for level in levels.values()]
        if any(values):
            tput[target] = [(v, v) for v in values]
    _grouped(axes[1], [f"{c} clients" for c in levels], tput)
    axes[1].set_ylabel("cells / second (trivial cell, 2 kernels)")
    axes[1].set_title("Throughput")

    pool = results.get("pool") or {}
    pool_points = [
        (_value(pool, "cases", c, "p50") or 0.0, _value(pool, "cases", c, "p95") or 0.0)
        for c in POOL_CASES
    ]
    _grouped(axes[2], list(POOL_CASES), {"kernel_pool": pool_points})
    axes[2].set_ylabel("seconds (p50, whisker to p95)")
    axes[2].set_title("Pool level (raw_execute = floor)")

    fig.suptitle(f"strata-kernel-worker benchmark ({results.get('meta', {}).get('mode', '')})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
