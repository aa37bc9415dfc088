"""The template case: one preload shared by forked kernels, against a preload in every kernel.

The preload builds a NumPy "model" (``np.ones``: every page written, so resident) and sleeps
for the rest of a model load; each run appends its pid and seconds to a file, which says
where and how often it ran. One worker after another, each stopped by PID before the next
starts, so at most one pool of models is in memory:

* ``one_preload``: one kernel that runs the preload itself (``--kernel-start spawn``); its
  start less its preload's seconds is "a kernel start" (launch, one kernel, its baseline);
* ``per_kernel``: a pool of 4 kernels that each run the preload (``--kernel-start spawn``);
* ``template``: a pool of 4 forks of the template, where the preload ran once (the default).

Each pool: launch until ``/ready`` is 200 with every kernel idle, against one preload plus a
kernel start; the PSS of the kernels and the template (``/health`` ``pool.memory``) against
the model's bytes; then kernels SIGKILLed one at a time, each timed until the pool has
counted it retired and every kernel is idle again. Last, with a smaller model, the trivial
cell's p50 under ``--recycle fresh --spares 2`` against ``--recycle reset``, back to back and
paced. This module owns the case's plan and runs; :mod:`bench.template_report` its
verdicts and lines of the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import statistics
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from .cases import prepare_request, worker_cases
from .errors import BenchError, Failure
from .measure import Attempt, HttpTarget, RunOnce, http_runner, latency
from .processes import ServerProcess, free_port, our_worker_argv, server_env
from .stats import summarize
from .template_report import GIB, MIB, template_ratios

log = logging.getLogger("bench.template")

ROOT = Path(__file__).resolve().parent.parent
POLL_SECONDS = 0.01
HEALTH_TIMEOUT_SECONDS = 10.0
POOLS = ("one_preload", "per_kernel", "template")
_STARTS = re.compile(r"^strata_kernel_worker_kernel_start_seconds_(count|sum) (\S+)$", re.M)


@dataclass(frozen=True, slots=True)
class TemplatePlan:
    """The preload's size and load time, the pools, and how much of each series to run."""

    model_bytes: int = 2 * GIB
    load_seconds: float = 5.0
    kernels: int = 4
    replacements: int = 5  # the template's (forks)
    per_kernel_replacements: int = 2  # each runs the preload again
    recycle_model_bytes: int = 200 * MIB  # the fresh/reset row: smaller, memory stays low
    recycle_kernels: int = 2
    spares: int = 2
    cells: int = 60  # back to back, per series
    paced_cells: int = 20
    pace_seconds: float = 0.2  # longer than a fork takes: the spares stay ahead
    budget_seconds: float = 240.0  # one worker's start, one replacement, one series

    @classmethod
    def make(cls, *, quick: bool) -> TemplatePlan:
        if quick:
            return cls()
        return cls(replacements=10, per_kernel_replacements=3, cells=200, paced_cells=50)


def preload_source(model_bytes: int, load_seconds: float, runs: Path) -> str:
    """The preload: a model of ``model_bytes`` and a sleep; appends ``pid seconds`` to ``runs``."""
    return (
        "import os as _os\nimport time as _time\n\nimport numpy as np\n\n"
        "_started = _time.perf_counter()\n"
        f"model = np.ones({model_bytes // 8})  # written: every page resident\n"
        f"_time.sleep({load_seconds!r})  # the rest of a model load\n"
        f"with open({str(runs)!r}, 'a') as _fh:\n"
        "    _fh.write(f'{_os.getpid()} {_time.perf_counter() - _started:.3f}\\n')\n"
        "del _started, _fh\n"
    )


def read_runs(text: str) -> dict[str, Any]:
    """How many times the preload ran, in how many processes, and its median seconds."""
    rows = [line.split() for line in text.splitlines() if line.strip()]
    seconds = [float(row[1]) for row in rows]
    return {
        "runs": len(rows),
        "processes": len({row[0] for row in rows}),
        "seconds_p50": statistics.median(seconds) if seconds else None,
    }


def memory_totals(health: dict[str, Any]) -> dict[str, Any]:
    """Bytes from ``/health`` ``pool.memory``: PSS and RSS of the template and the kernels."""
    memory = (health.get("pool") or {}).get("memory") or {}
    template = memory.get("template") or {}
    kernels = list((memory.get("kernels") or {}).values())
    kernels_pss = sum(int(k["pss"]) for k in kernels)
    return {
        "kernels": len(kernels),
        "template_pss": template.get("pss"),
        "kernels_pss": kernels_pss,
        "pss_total": int(template.get("pss") or 0) + kernels_pss,
        "rss_total": int(template.get("rss") or 0) + sum(int(k["rss"]) for k in kernels),
    }


def kernel_pids(worker_pid: int) -> list[int]:
    """The worker's live kernels: its descendants whose command line names ipykernel (blocking)."""
    try:
        children = psutil.Process(worker_pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE and any(
                "ipykernel" in part for part in child.cmdline()
            ):
                found.append(child.pid)
    return sorted(found)


@dataclass(slots=True)
class Context:
    """What every part of the case shares: the HTTP client, where files and logs go."""

    client: httpx.AsyncClient
    workdir: Path
    logs: Path
    failures: list[Failure]


async def _health(ctx: Context, url: str) -> dict[str, Any]:
    response = await ctx.client.get(url + "/health", timeout=HEALTH_TIMEOUT_SECONDS)
    body: dict[str, Any] = response.json()
    return body


def _idle(kernels: dict[str, int]) -> int:
    return int(kernels.get("idle", 0))


def _exited(pid: int | None) -> bool:
    try:
        return pid is None or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


@contextlib.asynccontextmanager
async def _worker(
    ctx: Context, name: str, argv_tail: list[str], *, kernels: int, preload: Path,
    budget_seconds: float, recycle: str = "reset", spares: int = 0,
) -> AsyncIterator[tuple[ServerProcess, float]]:  # fmt: skip
    """Launch a worker, wait for ``/ready`` with every kernel idle; stop it by PID after.

    Yields the server and the seconds from launch to ready (it answers HTTP only then).
    """
    port = free_port()
    run_dir = ctx.workdir / f"runs-template-{name}"
    run_dir.mkdir(exist_ok=True)
    argv = our_worker_argv(port, kernels=kernels, recycle=recycle, run_dir=run_dir,
                           spares=spares, preload=preload) + argv_tail  # fmt: skip
    server = ServerProcess(f"template-{name}", argv, port, ctx.logs / f"template-{name}.log")
    try:
        started = time.perf_counter()
        await server.start(server_env(inline_matplotlib=False), ROOT)
        deadline = time.monotonic() + budget_seconds
        while True:
            if _exited(server.pid):
                raise BenchError(f"{server.name} exited; see its log in {ctx.logs}")
            if time.monotonic() > deadline:
                raise BenchError(f"{server.name} was not ready in {budget_seconds:g}s")
            with contextlib.suppress(httpx.TransportError):
                response = await ctx.client.get(server.url + "/ready", timeout=5.0)
                ready = time.perf_counter() - started
                kernels_by_state = response.json()["kernels"]
                if response.status_code == 200 and _idle(kernels_by_state) >= kernels + spares:
                    break
            await asyncio.sleep(POLL_SECONDS)
        server.remember_children()
        yield server, ready
    finally:
        await server.stop()


def _retired(health: dict[str, Any]) -> int:
    return sum(int(n) for n in health["pool"]["retirements"].values())


async def _starts(ctx: Context, url: str) -> tuple[float, float]:
    """The pool's own kernel starts from ``/metrics``: how many, and their total seconds."""
    text = (await ctx.client.get(url + "/metrics", timeout=HEALTH_TIMEOUT_SECONDS)).text
    found = dict(_STARTS.findall(text))
    return float(found.get("count", 0)), float(found.get("sum", 0))


async def _replacement(
    ctx: Context, server: ServerProcess, kernels: int, budget: float
) -> tuple[float, float | None]:
    """SIGKILL one kernel; seconds until the pool has counted it retired, then until every
    kernel is idle again: on ``/health`` for the count, then on ``/ready`` (kernel counts
    only), whose answer costs the worker less while the replacement starts. Also the
    replacement's start as the pool timed it (``/metrics``), without noticing the death."""
    assert server.pid is not None  # started
    before = _retired(await _health(ctx, server.url))
    starts = await _starts(ctx, server.url)
    pids = await asyncio.to_thread(kernel_pids, server.pid)
    if not pids:
        raise BenchError(f"{server.name}: no kernel process found under pid {server.pid}")
    started = time.perf_counter()
    os.kill(pids[0], signal.SIGKILL)
    deadline = time.monotonic() + budget
    counted = False
    while time.monotonic() < deadline:
        if not counted:
            counted = _retired(await _health(ctx, server.url)) > before
        else:
            ready = await ctx.client.get(server.url + "/ready", timeout=HEALTH_TIMEOUT_SECONDS)
            if _idle(ready.json()["kernels"]) >= kernels:
                seconds = time.perf_counter() - started
                server.remember_children()  # the replacement, stopped with the rest
                count, total = await _starts(ctx, server.url)
                count, total = count - starts[0], total - starts[1]
                return seconds, total / count if count == 1 else None
        await asyncio.sleep(POLL_SECONDS)
    raise BenchError(f"{server.name}: no replacement for kernel {pids[0]} in {budget:g}s")


async def run_pool(ctx: Context, plan: TemplatePlan, name: str) -> dict[str, Any]:
    """One pool: its start, its memory, its replacements and where its preload ran."""
    kernels = 1 if name == "one_preload" else plan.kernels
    spawn = name != "template"
    runs = ctx.workdir / f"template-{name}.runs"
    preload = ctx.workdir / f"template-{name}-preload.py"
    source = preload_source(plan.model_bytes, plan.load_seconds, runs)
    await asyncio.to_thread(preload.write_text, source, encoding="utf-8")
    tail = ["--kernel-start", "spawn"] if spawn else []
    times: list[tuple[float, float | None]] = []
    replacements = {"template": plan.replacements, "per_kernel": plan.per_kernel_replacements}
    log.info("template case: %s, %d kernel(s)", name, kernels)
    async with _worker(ctx, name, tail, kernels=kernels, preload=preload,
                       budget_seconds=plan.budget_seconds) as (server, ready):  # fmt: skip
        memory = memory_totals(await _health(ctx, server.url))
        for _ in range(replacements.get(name, 0)):
            times.append(await _replacement(ctx, server, kernels, plan.budget_seconds))
    text = await asyncio.to_thread(runs.read_text) if runs.exists() else ""
    replaced = summarize([seconds for seconds, _ in times])
    own = summarize([start for _, start in times if start is not None])
    return {
        "kernels": kernels,
        "kernel_start": "spawn" if spawn else "fork",
        "ready_seconds": ready,
        "memory": memory,
        "replacement": replaced.as_dict() if replaced else None,
        "replacement_start": own.as_dict() if own else None,  # as the pool timed it
        "preload": read_runs(text),
    }


def _paced(run: RunOnce, seconds: float) -> RunOnce:
    async def paced() -> Attempt:
        await asyncio.sleep(seconds)  # untimed: the gap between two requests
        return await run()

    return paced


async def run_recycle(ctx: Context, plan: TemplatePlan) -> dict[str, Any]:
    """The trivial cell's latency, ``--recycle fresh --spares N`` against ``reset``."""
    runs = ctx.workdir / "template-recycle.runs"
    preload = ctx.workdir / "template-recycle-preload.py"
    source = preload_source(plan.recycle_model_bytes, plan.load_seconds, runs)
    await asyncio.to_thread(preload.write_text, source, encoding="utf-8")
    trivial = worker_cases(full=False)[0]
    request = await asyncio.to_thread(prepare_request, trivial, None)
    log.info("template case: fresh (--spares %d) vs reset", plan.spares)
    kwargs: dict[str, Any] = {"kernels": plan.recycle_kernels, "preload": preload,
                              "budget_seconds": plan.budget_seconds}  # fmt: skip
    series: dict[str, Any] = {}
    async with (
        _worker(ctx, "reset", [], recycle="reset", **kwargs) as (reset, _),
        _worker(ctx, "fresh", [], recycle="fresh", spares=plan.spares, **kwargs) as (fresh, _),
    ):
        for name, server, burst in (("reset", reset, plan.recycle_kernels), ("fresh", fresh, 0)):
            target = HttpTarget(name, server.url, ctx.client, server)
            run = http_runner(target, trivial, request)
            await _warm(run, burst)  # a connection, and (reset) every kernel's first cell
            for key, runner, reps in ((name, run, plan.cells),
                                      (f"{name}_paced", _paced(run, plan.pace_seconds),
                                       plan.paced_cells)):  # fmt: skip
                await target.settle()
                series[key] = await latency(
                    runner, reps=reps, warmups=0, burst=0, budget_seconds=plan.budget_seconds,
                    where=(f"template-{key}", trivial.name, request.description[:2000]),
                    failures=ctx.failures,
                )  # fmt: skip
    return {"model_bytes": plan.recycle_model_bytes, "kernels": plan.recycle_kernels,
            "spares": plan.spares, "pace_seconds": plan.pace_seconds, "series": series}  # fmt: skip


async def _warm(run: RunOnce, burst: int) -> None:
    attempts = [await run(), *await asyncio.gather(*(run() for _ in range(burst)))]
    problem = next((a for a in attempts if a.problem is not None), None)
    if problem is not None:
        raise BenchError(f"the warm-up request failed: {problem.problem} {problem.response}")


async def _guarded(
    failures: list[Failure], name: str, part: Awaitable[dict[str, Any]]
) -> dict[str, Any] | None:
    """A part that could not be measured is reported as a failure; the case goes on."""
    try:
        return await part
    except (BenchError, TimeoutError, httpx.HTTPError) as exc:
        failures.append(Failure("template", name, "setup", "-", None, repr(exc)))
        return None


async def run_template(
    plan: TemplatePlan, workdir: Path, logs: Path, failures: list[Failure]
) -> dict[str, Any]:
    """Every pool, one after another, then the fresh/reset row."""
    pools: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=plan.budget_seconds) as client:
        ctx = Context(client, workdir, logs, failures)
        for name in POOLS:
            pool = await _guarded(failures, name, run_pool(ctx, plan, name))
            if pool is not None:
                pools[name] = pool
        recycle = await _guarded(failures, "recycle", run_recycle(ctx, plan))
    results = {"model_bytes": plan.model_bytes, "load_seconds": plan.load_seconds,
               "pools": pools, "recycle": recycle}  # fmt: skip
    results["ratios"] = template_ratios(results)
    return results
