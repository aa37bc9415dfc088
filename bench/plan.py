"""How much to measure: repetitions and time bounds, for the quick and the standard run.

Every loop in the benchmark is bounded twice, by a count from here and by a wall-clock
budget, so a slow or stuck target costs at most its budget.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Reps:
    """Measured repetitions per target (the raw kernel uses ``ours``)."""

    ours: int
    fresh: int
    reference: int

    def for_target(self, target: str) -> int:
        if target in ("ours", "raw"):
            return self.ours
        return self.fresh if target == "fresh" else self.reference


@dataclass(frozen=True, slots=True)
class PoolPlan:
    floor: int
    lease: int
    cycle: int
    replacement: int
    throughput_seconds: float
    throughput_max: int


@dataclass(frozen=True, slots=True)
class ThroughputPlan:
    clients: tuple[int, ...]
    ours_seconds: float
    ours_max: int
    baseline_min: int
    """Requests per level for fresh/reference: at least one per client, at least this many."""


@dataclass(frozen=True, slots=True)
class BenchPlan:
    quick: bool
    full: bool
    pool: PoolPlan
    throughput: ThroughputPlan
    case_budget_seconds: float
    """Wall-clock cap for one target on one case (warm-ups included)."""
    reps_small: Reps  # trivial, pandas/matplotlib, PNG, 1 MB
    reps_medium: Reps  # 10 MB
    reps_large: Reps  # 100 MB
    reps_huge: Reps  # 1 GB (only with --full)
    kernels: int = 2

    @classmethod
    def make(cls, *, quick: bool, full: bool) -> BenchPlan:
        if quick:
            return cls(
                quick=True,
                full=full,
                pool=PoolPlan(300, 150, 150, 3, 3.0, 5000),
                throughput=ThroughputPlan((1, 4, 16), 2.0, 2000, 4),
                case_budget_seconds=45.0,
                reps_small=Reps(30, 3, 3),
                reps_medium=Reps(15, 3, 3),
                reps_large=Reps(3, 1, 1),
                reps_huge=Reps(2, 1, 1),
            )
        return cls(
            quick=False,
            full=full,
            pool=PoolPlan(2000, 1000, 1000, 10, 10.0, 50000),
            throughput=ThroughputPlan((1, 4, 16), 10.0, 20000, 16),
            case_budget_seconds=240.0,
            reps_small=Reps(300, 15, 10),
            reps_medium=Reps(60, 8, 6),
            reps_large=Reps(10, 3, 3),
            reps_huge=Reps(3, 2, 2),
        )
