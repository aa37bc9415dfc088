"""Latency summaries (median, tail percentiles) and the ratios between them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


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


LEAN_TARGETS = ("http_lean", "ours_lean")
"""The HTTP floor and ours again, from :mod:`bench.lean_client` (transfer cases only)."""
BASE_TARGETS = ("raw", "http", "ours", "fresh", "reference", *LEAN_TARGETS)


def result_p50(result: dict[str, Any] | None) -> float | None:
    """The median of one target's latency result (``None``: failed or not run)."""
    if not result or not result.get("latency"):
        return None
    value: float = result["latency"]["p50"]
    return value


def raw_plus_http(results: dict[str, Any], http: str = "http") -> float | None:
    """The raw kernel's median plus the HTTP floor's: a worker that added nothing."""
    raw, floor = result_p50(results.get("raw")), result_p50(results.get(http))
    return None if raw is None or floor is None else raw + floor


def case_ratios(results: dict[str, Any]) -> dict[str, float | None]:
    """A case's ratios on medians: ``ours/raw`` (overhead), ``ours/(raw+http)`` (overhead
    beyond moving the bytes over HTTP) and ``<baseline>/ours`` (speed-up)."""
    ours = result_p50(results.get("ours"))
    ratios = {
        "ours_vs_raw": ratio(ours, result_p50(results.get("raw"))),
        "ours_vs_raw_plus_http": ratio(ours, raw_plus_http(results)),
    }
    baselines = ["fresh", "reference", *(n for n in results if n not in BASE_TARGETS)]
    for name in baselines:
        ratios[f"{name}_vs_ours"] = ratio(result_p50(results.get(name)), ours)
    return ratios


TRANSFER_MIN_BYTES = 100_000_000


def transfer_rates(cases: dict[str, Any]) -> dict[str, Any]:
    """Effective MB/s (payload bytes / median seconds per request, end to end) for every
    target on the input and output cases of 100 MB and more, and for ``raw_plus_http`` (and
    ``raw_plus_http_lean``, with the lean client's floor)."""
    rates: dict[str, Any] = {}
    for name, case in cases.items():
        nbytes = case.get("bytes") or 0
        if nbytes < TRANSFER_MIN_BYTES:
            continue
        targets = case.get("targets") or {}
        per_target = {t: ratio(nbytes / 1e6, result_p50(targets.get(t))) for t in BASE_TARGETS}
        per_target["raw_plus_http"] = ratio(nbytes / 1e6, raw_plus_http(targets))
        lean_floor = raw_plus_http(targets, "http_lean")
        per_target["raw_plus_http_lean"] = ratio(nbytes / 1e6, lean_floor)
        rates[name] = {
            "label": case.get("label", name),
            "bytes": nbytes,
            "mb_per_second": per_target,
        }
    return rates
