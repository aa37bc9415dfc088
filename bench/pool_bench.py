"""Pool level (the "foundation" issue): what the pool adds to jupyter_client's round trip.

Measured, side by side in rounds so drift hits every series alike:

* ``raw_execute``: execute_request → reply + idle on a warm kernel, jupyter_client only;
* ``lease_execute``: ``async with pool.lease()`` + the same execute, kernel idle at entry;
* ``full_cycle``: back-to-back leases on a one-kernel pool, so each one waits for the
  previous lease's background reset;
* ``reset``: the pool's own reset timing (``stats().reset``) after each lease;
* ``replacement``: a lease that retires its kernel → the next lease holds a new warm one;
* ``throughput``: leases/s with two kernels and four concurrent callers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kernel_pool import Pool, PoolConfig, PoolError

from .errors import BenchError, Failure
from .plan import PoolPlan
from .rawkernel import RawKernel
from .stats import ratio, summarize

log = logging.getLogger("bench.pool")

TRIVIAL = "x = 1"
ROUNDS = 3
STEP_BUDGET_SECONDS = 60.0
EXECUTE_SECONDS = 30.0
LEASE_WAIT_SECONDS = 120.0


async def _execute_ok(run: Callable[[], Awaitable[Any]], what: str) -> None:
    result = await run()
    if not result.ok:
        raise BenchError(f"{what}: {result.reply.get('ename')}: {result.reply.get('evalue')}")


async def _floor_block(kernel: RawKernel, count: int, out: list[float]) -> None:
    stop = time.monotonic() + STEP_BUDGET_SECONDS
    for _ in range(count):
        if time.monotonic() > stop:
            return
        started = time.perf_counter()
        reply = await kernel.execute(TRIVIAL, deadline=time.monotonic() + EXECUTE_SECONDS)
        out.append(time.perf_counter() - started)
        if not reply.ok:
            raise BenchError(f"raw execute failed: {reply.problem()}")


async def _settle(pool: Pool, resets_before: int) -> float | None:
    """Wait (bounded, untimed) until the lease's reset finished and the kernel is idle again."""
    deadline = time.monotonic() + STEP_BUDGET_SECONDS
    while True:
        stats = pool.stats()
        if stats.reset.count > resets_before and stats.idle >= stats.size:
            return stats.reset.last_seconds
        if time.monotonic() > deadline:
            raise BenchError(f"pool did not settle: {stats.kernels_by_state}")
        await asyncio.sleep(0.001)


async def _timed_cell(pool: Pool, what: str) -> float:
    """Seconds for one lease running the trivial cell as its last (as the worker does)."""
    started = time.perf_counter()
    async with pool.lease(wait_seconds=LEASE_WAIT_SECONDS) as lease:
        result = await lease.execute(
            TRIVIAL, deadline=time.monotonic() + EXECUTE_SECONDS, last=True
        )
    seconds = time.perf_counter() - started
    if not result.ok:
        raise BenchError(f"{what} failed: {result.reply.get('evalue')}")
    return seconds


async def _lease_block(pool: Pool, count: int, out: list[float], resets: list[float]) -> None:
    stop = time.monotonic() + STEP_BUDGET_SECONDS
    for _ in range(count):
        if time.monotonic() > stop:
            return
        resets_before = pool.stats().reset.count
        out.append(await _timed_cell(pool, "lease execute"))
        reset = await _settle(pool, resets_before)
        if reset is not None:
            resets.append(reset)


async def _cycle_block(pool: Pool, count: int, out: list[float]) -> None:
    stop = time.monotonic() + STEP_BUDGET_SECONDS
    for i in range(count + 1):  # the first lease finds an idle kernel: not a full cycle
        if time.monotonic() > stop:
            return
        seconds = await _timed_cell(pool, "cycle execute")
        if i:
            out.append(seconds)


async def _replacements(pool: Pool, count: int) -> tuple[list[float], list[float]]:
    """Retire the only kernel, then time until a lease holds its warm replacement."""
    replaced: list[float] = []
    starts: list[float] = []
    stop = time.monotonic() + STEP_BUDGET_SECONDS * 2
    for _ in range(count):
        if time.monotonic() > stop:
            break
        async with pool.lease(wait_seconds=LEASE_WAIT_SECONDS) as lease:
            lease.retire()
        started = time.perf_counter()
        async with pool.lease(wait_seconds=LEASE_WAIT_SECONDS):
            replaced.append(time.perf_counter() - started)
        last_start = pool.stats().kernel_start.last_seconds
        if last_start is not None:
            starts.append(last_start)
    return replaced, starts


async def _throughput(pool: Pool, callers: int, plan: PoolPlan) -> dict[str, Any]:
    latencies: list[float] = []
    issued = 0
    deadline = time.monotonic() + plan.throughput_seconds

    async def caller() -> None:
        nonlocal issued
        while issued < plan.throughput_max and time.monotonic() < deadline:
            issued += 1
            latencies.append(await _timed_cell(pool, "throughput execute"))

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    elapsed = time.perf_counter() - started
    summary = summarize(latencies)
    return {
        "kernels": pool.config.size,
        "callers": callers,
        "leases": len(latencies),
        "seconds": elapsed,
        "leases_per_second": len(latencies) / elapsed if elapsed > 0 else None,
        "latency": summary.as_dict() if summary else None,
    }


async def _one_kernel_series(
    plan: PoolPlan, kernel: RawKernel, series: dict[str, list[float]]
) -> None:
    async with Pool(PoolConfig(size=1)) as pool:
        for _ in range(ROUNDS):
            await _floor_block(kernel, plan.floor // ROUNDS, series["raw_execute"])
            await _lease_block(pool, plan.lease // ROUNDS, series["lease_execute"], series["reset"])
            await _cycle_block(pool, plan.cycle // ROUNDS, series["full_cycle"])
        replaced, starts = await _replacements(pool, plan.replacement)
        series["replacement"].extend(replaced)
        series["kernel_start"].extend(starts)


async def run_pool_bench(plan: PoolPlan, workdir: Path, failures: list[Failure]) -> dict[str, Any]:
    """Every pool-level measurement; failures are recorded, never retried around."""
    names = ("raw_execute", "lease_execute", "full_cycle", "reset", "replacement", "kernel_start")
    series: dict[str, list[float]] = {name: [] for name in names}
    kernel = RawKernel(workdir, "pool-floor")
    throughput: dict[str, Any] | None = None
    try:
        await kernel.start()
        for _ in range(20):  # warm the floor kernel's code paths
            await kernel.execute(TRIVIAL, deadline=time.monotonic() + EXECUTE_SECONDS)
        await _one_kernel_series(plan, kernel, series)
        log.info("pool: one-kernel series done; throughput with 2 kernels")
        async with Pool(PoolConfig(size=2)) as pool:
            throughput = await _throughput(pool, 4, plan)
    except (BenchError, PoolError, TimeoutError) as exc:
        failures.append(Failure("pool", "kernel_pool", "pool", TRIVIAL, None, repr(exc)))
    finally:
        await kernel.stop()
    return _pool_report(series, throughput)


def _pool_report(
    series: dict[str, list[float]], throughput: dict[str, Any] | None
) -> dict[str, Any]:
    summaries = {name: summarize(samples) for name, samples in series.items()}
    floor = summaries["raw_execute"]
    floor_p50 = floor.p50 if floor else None

    def vs_floor(name: str) -> float | None:
        s = summaries[name]
        return ratio(s.p50 if s else None, floor_p50)

    return {
        "cases": {k: (v.as_dict() if v else None) for k, v in summaries.items()},
        "ratios_vs_floor": {
            "lease_execute": vs_floor("lease_execute"),
            "full_cycle": vs_floor("full_cycle"),
        },
        "goals": {"lease_execute": 1.5, "full_cycle": 2.0},
        "throughput": throughput,
    }
