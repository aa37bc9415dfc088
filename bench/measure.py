"""Measurement loops over one target: serial latency and concurrent throughput.

A target is anything that runs a cell and says whether it worked: an HTTP worker (ours in
reset or fresh mode, the reference) or the raw kernels. Loops are bounded by a count and a
wall-clock budget; the first failure of a target on a case is recorded and ends that
series (it is reported, not retried).
"""

from __future__ import annotations

import asyncio
import http.client
import io
import logging
import os
import tarfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from . import lean_client
from .cases import Case, PreparedRequest, check_bundle
from .errors import Failure
from .http_floor import RECEIVED_BYTES_HEADER, RESPONSE_BYTES_HEADER
from .processes import ServerProcess
from .rawkernel import RawKernel
from .stats import summarize

log = logging.getLogger("bench.measure")

RESPONSE_CAP = 4000
SETTLE_SECONDS = 180.0
LEAN_TIMEOUT_SECONDS = 900.0


@dataclass(frozen=True, slots=True)
class Attempt:
    seconds: float
    status: int | None
    problem: str | None
    response: str = ""


RunOnce = Callable[[], Awaitable[Attempt]]
CpuProbe = Callable[[], dict[str, float]]
"""Cumulative CPU seconds by role ("client", "server", "kernels"); blocking, run in a thread."""


@dataclass(slots=True)
class HttpTarget:
    name: str
    url: str
    client: httpx.AsyncClient
    server: ServerProcess | None  # None: a worker someone else runs (--compare-url)

    async def settle(self) -> None:
        """Let background work (resets, fresh kernel starts) finish before the next series."""
        if self.server is not None:
            await self.server.wait_healthy(self.client, SETTLE_SECONDS)


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    headers: Mapping[str, str]
    content: bytes


async def _post(
    target: HttpTarget, request: PreparedRequest, headers: dict[str, str], *, lean: bool
) -> tuple[_Answer | None, Attempt]:
    """POST the case's body to the target; the answer (when 200) and the attempt so far.

    ``lean``: with :mod:`bench.lean_client` instead of the target's httpx client.
    """
    url = target.url + "/v1/execute"
    started = time.perf_counter()
    try:
        if lean:
            got = await lean_client.apost(url, request.body, headers, LEAN_TIMEOUT_SECONDS)
            answer = _Answer(got.status, got.headers, got.content)
        else:
            response = await target.client.post(url, content=request.body, headers=headers)
            answer = _Answer(response.status_code, response.headers, response.content)
    except (httpx.HTTPError, OSError, http.client.HTTPException) as exc:
        return None, Attempt(time.perf_counter() - started, None, f"transport: {exc!r}")
    seconds = time.perf_counter() - started
    if answer.status != 200:
        text = answer.content[:RESPONSE_CAP].decode("utf-8", "replace")
        return None, Attempt(seconds, answer.status, f"HTTP {answer.status}", text)
    return answer, Attempt(seconds, 200, None)


def http_runner(
    target: HttpTarget, case: Case, request: PreparedRequest, *, lean: bool = False
) -> RunOnce:
    headers = {"content-type": request.content_type}

    async def run() -> Attempt:
        response, attempt = await _post(target, request, headers, lean=lean)
        if response is None:
            return attempt
        problem = await asyncio.to_thread(check_bundle, case, response.content)
        body = "" if problem is None else _manifest_text(response.content)
        return Attempt(attempt.seconds, 200, problem, body)

    return run


def floor_runner(
    target: HttpTarget, case: Case, request: PreparedRequest, *, lean: bool = False
) -> RunOnce:
    """The case's own request to the HTTP floor, asking for a response of its output's size."""
    headers = {
        "content-type": request.content_type,
        RESPONSE_BYTES_HEADER: str(case.output_bytes),
    }

    async def run() -> Attempt:
        response, attempt = await _post(target, request, headers, lean=lean)
        if response is None:
            return attempt
        received = response.headers.get(RECEIVED_BYTES_HEADER)
        problem = None
        if received != str(len(request.body)):
            problem = f"the floor read {received} of {len(request.body)} bytes"
        elif len(response.content) != case.output_bytes:
            problem = f"{len(response.content)} response bytes, not {case.output_bytes}"
        return Attempt(attempt.seconds, 200, problem)

    return run


def _manifest_text(content: bytes) -> str:
    try:
        with tarfile.open(fileobj=io.BytesIO(content), mode="r:*") as tar:
            member = tar.extractfile("manifest.json")
            return member.read().decode("utf-8", "replace")[:RESPONSE_CAP] if member else ""
    except (tarfile.TarError, KeyError, OSError):
        return repr(content[:RESPONSE_CAP])


def raw_runner(kernels: list[RawKernel], case: Case, source: str) -> RunOnce:
    """Run on whichever raw kernel is free (callers queue for them, as for a pool)."""
    free: asyncio.Queue[RawKernel] = asyncio.Queue()
    for kernel in kernels:
        free.put_nowait(kernel)

    async def run() -> Attempt:
        started = time.perf_counter()
        kernel = await free.get()
        try:
            reply = await kernel.execute(source, deadline=time.monotonic() + 600)
        except TimeoutError as exc:
            return Attempt(time.perf_counter() - started, None, repr(exc))
        finally:
            free.put_nowait(kernel)
        seconds = time.perf_counter() - started
        problem = reply.problem()
        if problem is None and case.expect_png and not reply.has_png():
            problem = "no image/png display_data"
        return Attempt(seconds, None, problem)

    return run


def failure(where: tuple[str, str, str], attempt: Attempt) -> Failure:
    target, case, request = where
    log.error("%s failed on %s: %s", target, case, attempt.problem)
    detail = f"{attempt.problem}\n{attempt.response}".strip()
    return Failure("worker", target, case, request, attempt.status, detail)


async def latency(
    run: RunOnce, *, reps: int, warmups: int, burst: int, budget_seconds: float,
    where: tuple[str, str, str], failures: list[Failure],
) -> dict[str, Any]:  # fmt: skip
    """Serial requests after ``warmups`` unrecorded ones (the very first is kept as ``first``).

    After the first request, ``burst`` concurrent ones (unrecorded) make sure every kernel
    of a pool has run the cell once, so "warm" means warm on all of them.
    """
    samples: list[float] = []
    first: float | None = None
    stop = time.monotonic() + budget_seconds
    for i in range(warmups + reps):
        if samples and time.monotonic() > stop:
            break
        attempt = await run()
        if attempt.problem is None and i == 0 and burst > 1:
            first = attempt.seconds
            extra = await asyncio.gather(*(run() for _ in range(burst)))
            attempt = next((a for a in extra if a.problem is not None), attempt)
        if attempt.problem is not None:
            failures.append(failure(where, attempt))
            break
        if i == 0 and first is None:
            first = attempt.seconds
        if i >= warmups:
            samples.append(attempt.seconds)
    summary = summarize(samples)
    return {"first": first, "latency": summary.as_dict() if summary else None}


async def interleaved_latency(
    runs: dict[str, RunOnce], *, reps: int, burst: int, block: int, budget_seconds: float,
    where: dict[str, tuple[str, str, str]], failures: list[Failure],
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Serial requests to several targets, in blocks of ``block`` per target, round-robin.

    Each target first gets its unrecorded first request (kept as ``first``) and ``burst``
    concurrent ones, as in :func:`latency`. The recorded requests then alternate between the
    targets a block at a time (back to back within a block, as in a series of its own), so
    the machine's drift over the case hits every target alike and the ratios between them
    hold still from run to run. A target that fails leaves the rotation.
    """
    firsts: dict[str, float | None] = {}
    samples: dict[str, list[float]] = {}
    for name, run in runs.items():
        attempt = await run()
        if attempt.problem is None and burst > 1:
            extra = await asyncio.gather(*(run() for _ in range(burst)))
            attempt = next((a for a in extra if a.problem is not None), attempt)
        if attempt.problem is not None:
            failures.append(failure(where[name], attempt))
            continue
        firsts[name], samples[name] = attempt.seconds, []
    active = list(samples)
    stop = time.monotonic() + budget_seconds * max(1, len(active))
    rounds = 0
    while active and any(len(samples[name]) < reps for name in active):
        if rounds and time.monotonic() > stop:
            break
        order = active[rounds % len(active) :] + active[: rounds % len(active)]
        rounds += 1
        for name in order:
            for _ in range(min(block, reps - len(samples[name]))):
                attempt = await runs[name]()
                if attempt.problem is not None:
                    failures.append(failure(where[name], attempt))
                    active.remove(name)
                    break
                samples[name].append(attempt.seconds)
    results: dict[str, dict[str, Any]] = {}
    for name in runs:
        summary = summarize(samples.get(name, []))
        results[name] = {
            "first": firsts.get(name),
            "latency": summary.as_dict() if summary else None,
        }
    return results


async def throughput(
    run: RunOnce, *, clients: int, max_requests: int, seconds: float,
    where: tuple[str, str, str], failures: list[Failure], cpu: CpuProbe | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``clients`` concurrent callers sharing one runner, until the count or time runs out."""
    latencies: list[float] = []
    problems: list[Attempt] = []
    issued = 0
    deadline = time.monotonic() + seconds

    async def caller() -> None:
        nonlocal issued
        while issued < max_requests and time.monotonic() < deadline and not problems:
            issued += 1
            attempt = await run()
            if attempt.problem is not None:
                problems.append(attempt)
                return
            latencies.append(attempt.seconds)

    cpu_before = await asyncio.to_thread(cpu) if cpu else {}
    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    cpu_after = await asyncio.to_thread(cpu) if cpu else {}
    if problems:
        failures.append(failure(where, problems[0]))
    summary = summarize(latencies)
    return {
        "clients": clients,
        "requests": len(latencies),
        "seconds": elapsed,
        "cells_per_second": len(latencies) / elapsed if elapsed > 0 and latencies else None,
        "latency": summary.as_dict() if summary else None,
        **_cpu_report(cpu_before, cpu_after, len(latencies), elapsed),
    }


def _cpu_report(
    before: dict[str, float], after: dict[str, float], cells: int, elapsed: float
) -> dict[str, Any]:
    """CPU seconds per cell by role, and how busy the machine's cores were (approximate)."""
    if not before or not cells or elapsed <= 0:
        return {}
    used = {role: max(0.0, after.get(role, 0.0) - value) for role, value in before.items()}
    cores = os.cpu_count() or 1
    return {
        "cpu_seconds_per_cell": {role: value / cells for role, value in used.items()},
        "cpu_utilization": sum(used.values()) / (cores * elapsed),
    }
