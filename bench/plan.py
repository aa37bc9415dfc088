"""How much to measure: repetitions and time bounds, for the quick and the standard run.

Every loop in the benchmark is bounded twice, by a count from here and by a wall-clock
budget, so a slow or stuck target costs at most its budget.
"""

from __future__ import annotations

from dataclasses import dataclass

MB = 1_000_000


@dataclass(frozen=True, slots=True)
class Reps:
    """Measured repetitions per target (the raw kernel, the HTTP floor and the lean-client
    series use ``ours``)."""

    ours: int
    fresh: int
    reference: int

    def for_target(self, target: str) -> int:
        if target in ("ours", "raw", "http", "http_lean", "ours_lean"):
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
class PreloadPlan:
    """The "preloaded model" case: requests per series (each a ~2 s build for the baselines)."""

    ours: int
    fresh: int  # back to back: replacements (kernel start + preload) may not keep up
    fresh_paced: int  # every kernel idle again before each request
    reference: int  # rebuilds the model in every cell


@dataclass(frozen=True, slots=True)
class ChurnPlan:
    """Every ``every``-th request kills its own kernel; the others are timed."""

    every: int
    requests: int  # ours (spares 1, and spares 0), back to back
    paced_requests: int  # ours (spares 1) with ``pace_seconds`` between requests
    pace_seconds: float
    baseline_requests: int  # fresh mode and the reference (~0.6-1 s per cell)
    budget_seconds: float


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """RSS over ``cells`` trivial cells (growth after ``warmup``), and one large output."""

    cells: int
    warmup: int
    samples: int
    output_bytes: int
    budget_seconds: float


@dataclass(frozen=True, slots=True)
class LibraryPlan:
    """The library matrix: runs per library on a one-kernel worker of its own."""

    warm_runs: int  # after the first (cold) run, each on the same kernel
    reference_runs: int  # after one unrecorded warm-up (a new process per cell anyway)
    budget_seconds: float  # per library and target


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
    preload: PreloadPlan
    churn: ChurnPlan
    memory: MemoryPlan
    libraries: LibraryPlan
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
                # the interleaved targets' medians are the ratios: enough of them (~15 s)
                reps_small=Reps(100, 3, 3),
                reps_medium=Reps(30, 3, 3),
                reps_large=Reps(7, 1, 1),  # 3 gave medians one slow request could move
                reps_huge=Reps(2, 1, 1),
                preload=PreloadPlan(30, 6, 3, 3),
                churn=ChurnPlan(10, 200, 60, 0.15, 12, 45.0),
                memory=MemoryPlan(1000, 100, 20, (1000 if full else 100) * MB, 120.0),
                libraries=LibraryPlan(5, 2, 60.0),
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
            preload=PreloadPlan(300, 12, 6, 6),
            churn=ChurnPlan(10, 1000, 200, 0.15, 30, 240.0),
            memory=MemoryPlan(10_000, 1000, 50, (1000 if full else 100) * MB, 900.0),
            libraries=LibraryPlan(20, 3, 120.0),
        )
