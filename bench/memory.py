"""Case 9, memory: does RSS grow over many cells, and how much does a large output cost?

* growth: the worker's RSS and its kernels' total RSS, sampled (with every kernel idle)
  every few cells over N trivial cells, on a worker started for this case; the growth is
  judged from the end of the warm-up to the last sample. The raw kernels (no reset) run the
  same cells as the baseline.
* large output: one cell returning a 100 MB (1 GB with ``--full``) DataFrame; the worker's
  peak RSS above its idle baseline, exact from the kernel's high-water mark (``VmHWM``,
  reset just before) where Linux offers it, else sampled every 10 ms like the kernels'
  total and the reference's (its server plus the processes it runs the cell in).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from .cases import output_case, prepare_request, worker_cases
from .errors import BenchError, Failure
from .measure import Attempt, HttpTarget, RunOnce, failure, http_runner, raw_runner
from .plan import MB, BenchPlan
from .processes import peak_rss, process_rss, reset_peak_rss
from .rawkernel import RawKernel

RssProbe = Callable[[], dict[str, int]]
"""Resident bytes by role ("worker", "kernels"); blocking, run in a thread."""
Settle = Callable[[], Awaitable[None]]

SAMPLE_INTERVAL_SECONDS = 0.01
PEAK_MAX_SECONDS = 900.0


class PeakSampler:
    """Samples a process's RSS and its descendants' total in a thread until the block ends."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-rss", daemon=True)
        self.own = 0
        self.descendants = 0
        self.samples = 0

    def _loop(self) -> None:
        deadline = time.monotonic() + PEAK_MAX_SECONDS
        while not self._stop.is_set() and time.monotonic() < deadline:
            own, descendants = process_rss(self._pid)
            self.own = max(self.own, own)
            self.descendants = max(self.descendants, descendants)
            self.samples += 1
            self._stop.wait(SAMPLE_INTERVAL_SECONDS)

    async def __aenter__(self) -> PeakSampler:
        self._thread.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join)


async def rss_growth(
    run: RunOnce, probe: RssProbe, settle: Settle | None, *, cells: int, warmup: int,
    samples: int, budget_seconds: float, where: tuple[str, str, str], failures: list[Failure],
) -> dict[str, Any]:  # fmt: skip
    """Serial cells; after every ``cells // samples`` of them (and at 0), RSS by role."""
    every = max(1, cells // max(1, samples))
    points = [await _point(0, probe, settle)]
    stop = time.monotonic() + budget_seconds
    for i in range(1, cells + 1):
        attempt = await run()
        if attempt.problem is not None:
            failures.append(failure(where, attempt))
            break
        if i % every == 0 or i == cells or time.monotonic() > stop:
            points.append(await _point(i, probe, settle))
            if time.monotonic() > stop:
                break
    roles = [role for role in points[0] if role != "cells"]
    return {
        "cells": points[-1]["cells"],
        "warmup": warmup,
        "points": points,
        **{role: _growth(points, role, warmup) for role in roles},
    }


async def _point(cells: int, probe: RssProbe, settle: Settle | None) -> dict[str, float]:
    if settle is not None:
        await settle()
    rss = await asyncio.to_thread(probe)
    return {"cells": cells, **{role: value / MB for role, value in rss.items()}}


def _growth(points: list[dict[str, float]], role: str, warmup: int) -> dict[str, Any]:
    """MB at start, after the warm-up, at the end, the max; growth after the warm-up in %."""
    warm = next((p for p in points if p["cells"] >= warmup), points[-1])
    start, end = points[0][role], points[-1][role]
    measured = points[-1]["cells"] > warm["cells"]
    growth = (end - warm[role]) / warm[role] * 100 if measured and warm[role] > 0 else None
    return {
        "start_mb": start,
        "warm_mb": warm[role],
        "end_mb": end,
        "max_mb": max(p[role] for p in points),
        "growth_percent": growth,
    }


async def output_peak(
    run: RunOnce, pid: int, settle: Settle | None, *, nbytes: int,
    where: tuple[str, str, str], failures: list[Failure],
) -> dict[str, Any]:  # fmt: skip
    """One large-output request: peak RSS of ``pid`` and its descendants above their idle."""
    if settle is not None:
        await settle()
    own, descendants = await asyncio.to_thread(process_rss, pid)
    exact = await asyncio.to_thread(reset_peak_rss, pid)
    async with PeakSampler(pid) as sampler:
        attempt: Attempt = await run()
    high_water = await asyncio.to_thread(peak_rss, pid) if exact else None
    if attempt.problem is not None:
        failures.append(failure(where, attempt))
        return {"bytes": nbytes, "seconds": None}
    peak = max(sampler.own, high_water or 0)
    return {
        "bytes": nbytes,
        "seconds": attempt.seconds,
        "server_baseline_mb": own / MB,
        "server_peak_mb": peak / MB,
        "server_above_mb": (peak - own) / MB,
        "server_above_per_output_byte": (peak - own) / nbytes,
        "server_peak_from": "VmHWM" if high_water else f"{sampler.samples} samples",
        "children_baseline_mb": descendants / MB,
        "children_above_mb": max(0, sampler.descendants - descendants) / MB,
    }


async def run_memory(
    plan: BenchPlan, ours: HttpTarget, raw: list[RawKernel], reference: HttpTarget | None,
    failures: list[Failure],
) -> dict[str, Any]:  # fmt: skip
    """RSS growth (ours, raw kernels), then the large output's peak (ours, the reference)."""
    memory = plan.memory
    trivial = worker_cases(full=False)[0]
    request = await asyncio.to_thread(prepare_request, trivial, None)
    pid = ours.server.pid if ours.server is not None else None
    if pid is None:
        raise BenchError("the memory case needs a worker started by the benchmark")

    def ours_rss() -> dict[str, int]:
        worker, kernels = process_rss(pid)
        return {"worker": worker, "kernels": kernels}

    def raw_rss() -> dict[str, int]:
        return {"kernels": sum(process_rss(k.pid)[0] for k in raw if k.pid is not None)}

    growth_args: dict[str, Any] = {
        "cells": memory.cells, "warmup": memory.warmup, "samples": memory.samples,
        "budget_seconds": memory.budget_seconds, "failures": failures,
    }  # fmt: skip
    growth = {
        "ours": await rss_growth(http_runner(ours, trivial, request), ours_rss, ours.settle,
                                 where=("ours", "memory_growth", request.description),
                                 **growth_args),
        "raw": await rss_growth(raw_runner(raw, trivial, trivial.source), raw_rss, None,
                                where=("raw", "memory_growth", repr(trivial.source)),
                                **growth_args),
    }  # fmt: skip
    return {"growth": growth, "large_output": await _large_output(plan, ours, reference, failures)}


async def _large_output(
    plan: BenchPlan, ours: HttpTarget, reference: HttpTarget | None, failures: list[Failure]
) -> dict[str, Any]:
    """Warm each target with a 1 MB output (imports, code paths), then one large output."""
    nbytes = plan.memory.output_bytes
    warm, large = (
        output_case("output_1mb", MB, "small"),
        output_case("memory_output", nbytes, "large"),
    )
    warm_request, large_request = await asyncio.gather(
        asyncio.to_thread(prepare_request, warm, None),
        asyncio.to_thread(prepare_request, large, None),
    )
    results: dict[str, Any] = {"bytes": nbytes}
    for name, target in (("ours", ours), ("reference", reference)):
        if target is None or target.server is None or target.server.pid is None:
            continue  # a reference someone else runs: its processes are not ours to sample
        where = (name, large.name, large_request.description)
        warm_run = http_runner(target, warm, warm_request)
        attempts = await asyncio.gather(*(warm_run() for _ in range(plan.kernels)))
        problem = next((a for a in attempts if a.problem is not None), None)
        if problem is not None:
            failures.append(failure(where, problem))
            continue
        results[name] = await output_peak(
            http_runner(target, large, large_request), target.server.pid, target.settle,
            nbytes=nbytes, where=where, failures=failures,
        )  # fmt: skip
        await target.settle()
    return results
