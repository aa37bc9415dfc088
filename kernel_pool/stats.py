"""Counters the pool keeps, and the immutable snapshot it hands out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from .config import PoolConfig
from .lease import RetireReason


@dataclass(frozen=True, slots=True)
class DurationSummary:
    count: int = 0
    total_seconds: float = 0.0
    max_seconds: float = 0.0
    last_seconds: float | None = None

    def add(self, seconds: float) -> DurationSummary:
        return DurationSummary(
            self.count + 1,
            self.total_seconds + seconds,
            max(self.max_seconds, seconds),
            seconds,
        )

    @property
    def mean_seconds(self) -> float | None:
        return self.total_seconds / self.count if self.count else None


@dataclass(frozen=True, slots=True)
class PoolStats:
    """A point-in-time view of the pool, for health checks and metrics."""

    size: int
    spares: int
    target_kernels: int
    kernels_by_state: Mapping[str, int]
    uses_per_kernel: Mapping[str, int]
    leases_served: int
    lease_wait: DurationSummary
    reset: DurationSummary
    kernel_start: DurationSummary
    retirements: Mapping[str, int]
    start_failures: int
    last_start_error: str | None
    closing: bool
    gpu_slots: tuple[str, ...] = field(default=())
    inline_resets: int = 0
    """Resets the kernel ran by itself after the lease's last cell replied (of ``reset``)."""
    busy_slots: tuple[str, ...] = field(default=())
    """GPU slots of the kernels currently leased."""

    @property
    def idle(self) -> int:
        return self.kernels_by_state.get("idle", 0)

    @property
    def busy(self) -> int:
        return self.kernels_by_state.get("busy", 0)


class StatsRecorder:
    """Mutable counters owned by one pool."""

    def __init__(self) -> None:
        self._leases = 0
        self._lease_wait = DurationSummary()
        self._reset = DurationSummary()
        self._inline_resets = 0
        self._start = DurationSummary()
        self._retirements: Counter[str] = Counter()
        self._start_failures = 0
        self._last_start_error: str | None = None

    def leased(self, wait_seconds: float) -> None:
        self._leases += 1
        self._lease_wait = self._lease_wait.add(wait_seconds)

    def reset_done(self, seconds: float, *, inline: bool = False) -> None:
        self._reset = self._reset.add(seconds)
        self._inline_resets += inline

    def started(self, seconds: float) -> None:
        self._start = self._start.add(seconds)

    def start_failed(self, error: str) -> None:
        self._start_failures += 1
        self._last_start_error = error

    def retired(self, reason: RetireReason) -> None:
        self._retirements[reason.value] += 1

    def snapshot(
        self,
        *,
        config: PoolConfig,
        states: Mapping[str, int],
        uses: Mapping[str, int],
        closing: bool,
        busy_slots: tuple[str, ...] = (),
    ) -> PoolStats:
        return PoolStats(
            size=config.size,
            spares=config.spares,
            target_kernels=config.target_kernels,
            kernels_by_state=dict(states),
            uses_per_kernel=dict(uses),
            leases_served=self._leases,
            lease_wait=self._lease_wait,
            reset=self._reset,
            kernel_start=self._start,
            retirements={r.value: self._retirements.get(r.value, 0) for r in RetireReason},
            start_failures=self._start_failures,
            last_start_error=self._last_start_error,
            closing=closing,
            gpu_slots=config.gpu_slots,
            inline_resets=self._inline_resets,
            busy_slots=busy_slots,
        )
