"""Prometheus metrics: the pool's state read at scrape time, plus the worker's own counters.

One registry per application (no module-level singletons). ``GET /metrics`` serves it behind
the token gate, or ``--metrics-port`` serves it on a separate (unauthenticated) port.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from kernel_pool import Pool, PoolMemory, PoolSet

from .environments.kernels import LockedKernels

_PREFIX = "strata_kernel_worker"
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
FORWARD_OUTCOMES = {
    "poll": ("found", "not_found", "peers_failed", "interrupted"),
    "cancel": ("cancelled", "not_running", "interrupted"),
}
"""How a job poll or a cancel sent on to the peers (see http/fleet.py) can end."""


class _PoolCollector(Collector):
    """Reads the pool's stats snapshot and the worker's queue when scraped."""

    def __init__(
        self,
        pool: Pool,
        gauges: Callable[[], dict[str, int]],
        memory: Callable[[], PoolMemory],
    ) -> None:
        self._pool = pool
        self._gauges = gauges
        self._memory = memory

    def collect(self) -> Iterator[Metric]:
        stats = self._pool.stats()
        kernels = GaugeMetricFamily(f"{_PREFIX}_kernels", "Kernels by state", labels=["state"])
        for state, count in stats.kernels_by_state.items():
            kernels.add_metric([state], count)
        yield kernels
        yield CounterMetricFamily(f"{_PREFIX}_leases", "Leases served", stats.leases_served)
        retired = CounterMetricFamily(
            f"{_PREFIX}_kernel_retirements", "Kernels retired, by reason", labels=["reason"]
        )
        for reason, count in stats.retirements.items():
            retired.add_metric([reason], count)
        yield retired
        yield CounterMetricFamily(
            f"{_PREFIX}_inline_resets",
            "Resets a kernel ran by itself right after the cell replied (no second request)",
            stats.inline_resets,
        )
        yield CounterMetricFamily(
            f"{_PREFIX}_kernel_start_failures", "Kernel starts that failed", stats.start_failures
        )
        for name, summary, text in (
            ("lease_wait_seconds", stats.lease_wait, "Time waiting for a kernel"),
            ("reset_seconds", stats.reset, "Time resetting a kernel after a lease"),
            ("kernel_start_seconds", stats.kernel_start, "Time to start a warm kernel"),
        ):
            yield SummaryMetricFamily(
                f"{_PREFIX}_{name}",
                text,
                count_value=summary.count,
                sum_value=summary.total_seconds,
            )
        yield from _memory_metrics(self._memory())
        for name, value in self._gauges().items():
            yield GaugeMetricFamily(f"{_PREFIX}_{name}", name.replace("_", " ").capitalize(), value)


def _memory_metrics(memory: PoolMemory) -> Iterator[Metric]:
    """Memory as last measured in the background (see memory_watch): a scrape reads none."""
    kernels = GaugeMetricFamily(
        f"{_PREFIX}_kernel_memory_bytes",
        "Kernel memory: rss, pss (shared pages in equal parts), uss (its own)",
        labels=["kernel", "kind"],
    )
    for kernel, usage in memory.kernels.items():
        for kind in ("rss", "pss", "uss"):
            kernels.add_metric([kernel, kind], getattr(usage, kind))
    yield kernels
    template = GaugeMetricFamily(
        f"{_PREFIX}_template_memory_bytes",
        "Memory of the template (the fork server, holding the preload kernels share)",
        labels=["kind"],
    )
    if memory.template is not None:
        for kind in ("rss", "pss", "uss"):
            template.add_metric([kind], getattr(memory.template, kind))
    yield template


class _EnvironmentCollector(Collector):
    """Locked environments and their pools, read when scraped (no disk walked here)."""

    def __init__(self, pools: PoolSet, environments: LockedKernels) -> None:
        self._pools = pools
        self._environments = environments

    def collect(self) -> Iterator[Metric]:
        prepared = CounterMetricFamily(
            f"{_PREFIX}_environments_prepared",
            "Cells' locked environments made ready, by how: built, fetched, cached, failed",
            labels=["origin"],
        )
        for origin in ("built", "fetched", "cached", "failed"):
            prepared.add_metric([origin], self._environments.counts.get(origin, 0))
        yield prepared
        yield CounterMetricFamily(
            f"{_PREFIX}_environment_build_seconds",
            "Time spent building or fetching environments",
            self._environments.build_seconds,
        )
        pools = [p for p in self._pools.stats() if not p.default]
        yield GaugeMetricFamily(
            f"{_PREFIX}_environment_pools", "Live pools of locked environments", len(pools)
        )
        kernels = GaugeMetricFamily(
            f"{_PREFIX}_environment_kernels", "Kernels of each environment's pool", labels=["pool"]
        )
        for pool in pools:
            kernels.add_metric([pool.kind], pool.kernels)
        yield kernels
        yield GaugeMetricFamily(
            f"{_PREFIX}_environment_disk_bytes",
            "Bytes the built environments take under the root (measured after each build)",
            sum(entry.bytes for entry in self._environments.disk),
        )
        yield CounterMetricFamily(
            f"{_PREFIX}_environment_pools_stopped",
            "Idle environment pools stopped to make room under --max-kernels",
            self._pools.pools_stopped,
        )


class WorkerMetrics:
    """The worker's metrics registry and the instruments request handlers update."""

    def __init__(
        self,
        pool: Pool,
        gauges: Callable[[], dict[str, int]],
        memory: Callable[[], PoolMemory],
    ) -> None:
        """``memory``: the default pool's memory as last measured."""
        self.registry = CollectorRegistry()
        self.executions = Histogram(
            f"{_PREFIX}_execution_seconds",
            "Cell execution time (lease to bundle), by outcome",
            ["outcome"],
            buckets=_DURATION_BUCKETS,
            registry=self.registry,
        )
        self.bytes_in = Counter(
            f"{_PREFIX}_input_bytes", "Input bytes received", registry=self.registry
        )
        self.bytes_out = Counter(
            f"{_PREFIX}_bundle_bytes", "Output bundle bytes produced", registry=self.registry
        )
        self.accepted = Counter(
            f"{_PREFIX}_accepted",
            "Executions answered 202 with a job URL to poll (no kernel within --queue-wait)",
            registry=self.registry,
        )
        self.forwarded = Counter(
            f"{_PREFIX}_forwarded",
            "Job polls and cancels sent on to the peers, by request and outcome",
            ["request", "outcome"],
            registry=self.registry,
        )
        self.forward_seconds = Histogram(
            f"{_PREFIX}_forward_seconds",
            "Time to answer a job poll or a cancel sent on to the peers",
            ["request"],
            buckets=_DURATION_BUCKETS,
            registry=self.registry,
        )
        for request, outcomes in FORWARD_OUTCOMES.items():  # every series there from the start
            self.forward_seconds.labels(request)
            for outcome in outcomes:
                self.forwarded.labels(request, outcome)
        self.registry.register(_PoolCollector(pool, gauges, memory))

    def observe_forward(self, request: str, outcome: str, seconds: float) -> None:
        """Count one job poll or cancel the peers were asked about (see http/fleet.py)."""
        self.forwarded.labels(request, outcome).inc()
        self.forward_seconds.labels(request).observe(seconds)

    def watch_environments(self, pools: PoolSet, environments: LockedKernels) -> None:
        """Export locked environments and their pools too."""
        self.registry.register(_EnvironmentCollector(pools, environments))
