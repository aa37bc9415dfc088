"""Latency summaries (median, tail percentiles) and the ratios between them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class Summary:
    """Order statistics of one set of samples, in seconds."""

    count: int
    p50: float
    p95: float
    p99: float
    mean: float
    min: float
    max: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of sorted samples, linearly interpolated."""
    if not ordered:
        raise ValueError("no samples")
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(samples: Sequence[float]) -> Summary | None:
    """``None`` for no samples (a case that failed or was skipped)."""
    if not samples:
        return None
    ordered = sorted(samples)
    return Summary(
        count=len(ordered),
        p50=percentile(ordered, 50),
        p95=percentile(ordered, 95),
        p99=percentile(ordered, 99),
        mean=sum(ordered) / len(ordered),
        min=ordered[0],
        max=ordered[-1],
    )


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def p50(summary: Summary | None) -> float | None:
    return None if summary is None else summary.p50
