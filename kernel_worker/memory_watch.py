"""Kernel memory, measured off the event loop at most every couple of seconds: :class:`MemoryWatch`.

Reading a process's ``smaps_rollup`` costs time that grows with its resident size and its
number of mappings, both of which a cell controls (64k mappings survive a reset). So no
probe or scrape measures memory itself: one background task measures every pool's kernels
in a thread, every ``interval_seconds``, and ``/health`` and ``/metrics`` serve the last
measurement, with its age. Retiring a kernel over ``--max-kernel-memory`` is the pool's
own (cheap) check after each lease, not this one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

from kernel_pool import Pool, PoolMemory, PoolSet

__all__ = ["DEFAULT_INTERVAL_SECONDS", "MemorySnapshot", "MemoryWatch"]

DEFAULT_INTERVAL_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class MemorySnapshot:
    """Each pool's memory (by kind name) when last measured."""

    pools: Mapping[str, PoolMemory]
    measured_at: float | None  # time.monotonic(); None before the first measurement

    def of(self, kind: str) -> PoolMemory:
        return self.pools.get(kind) or PoolMemory(template=None, kernels={})

    def age_seconds(self) -> float | None:
        return None if self.measured_at is None else time.monotonic() - self.measured_at


class MemoryWatch:
    """Measures the memory of every pool of ``pools`` in a thread, every interval."""

    def __init__(self, pools: PoolSet, interval_seconds: float = DEFAULT_INTERVAL_SECONDS) -> None:
        self._pools = pools
        self._interval = interval_seconds
        self.latest = MemorySnapshot(pools={}, measured_at=None)

    async def run(self) -> None:
        """Measure now and then every interval, until cancelled."""
        while True:
            await self.measure()
            await asyncio.sleep(self._interval)

    async def measure(self) -> MemorySnapshot:
        pools = dict(self._pools.pools())  # on the loop: the pools alive now
        measured = await asyncio.to_thread(_measure, pools)
        self.latest = MemorySnapshot(pools=measured, measured_at=time.monotonic())
        return self.latest


def _measure(pools: Mapping[str, Pool]) -> dict[str, PoolMemory]:
    """Blocking: each pool's memory (the pool copies its kernel list before reading)."""
    return {name: pool.memory() for name, pool in pools.items()}
