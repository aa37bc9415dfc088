"""Soak: a mixed load from concurrent clients while a chaos task kills kernels.

``python -m bench.soak --minutes 10`` starts a worker (``--pool-size 2 --spares 1
--queue-wait 30``) on a free loopback port and, for the given time, sends it a mix of cells
from 8 clients: trivial cells, JSON and Arrow inputs, cells that raise, short timeouts,
matplotlib PNG displays, and 1-3 MB Arrow inputs whose doubled values come back as an output
(large enough to be written over kept files: the output is checked value by value). Every cell carries a unique token and its answer must carry exactly
that token (in a variable and in stdout), so answers mixed between requests are caught.
Meanwhile a chaos task SIGKILLs a random kernel every 0.5-1 s. Writes
``bench/results/soak.json`` (counts by status and kind, p50/p99 latency, RSS and fd samples,
every problem found) and ``bench/results/soak.png`` (RSS and latency over time). Exits 1 when
any answer was wrong or anything leaked.

``tests/system/test_chaos.py`` runs the same mix (:func:`run_mix`) for a bounded number of requests.
Every loop here is bounded by a count and a deadline; the worker binds 127.0.0.1 and is
stopped by PID (its kernels too).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from kernel_pool.forkserver import FORK_SERVER_SCRIPT
from kernel_worker.settings import default_run_root

from .processes import free_port, server_env
from .soak_mix import MIX, Planned, check, plan
from .stats import summarize

ROOT = Path(__file__).resolve().parent.parent
CLIENT_TIMEOUT_SECONDS = 90.0
RSS_BOUND_MB = 100.0  # worker RSS growth accepted over a run (after a warm-up)
FD_SLACK = 8  # open fds of the worker accepted above its warm baseline


@dataclass(frozen=True, slots=True)
class Outcome:
    index: int
    kind: str
    status: int | None  # None: no answer (transport error)
    started: float  # seconds since the run began
    seconds: float
    problem: str | None


@dataclass
class MixResult:
    outcomes: list[Outcome] = field(default_factory=list)
    kills: int = 0
    kernel_pids: set[int] = field(default_factory=set)
    samples: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def problems(self) -> list[str]:
        return [f"#{o.index} {o.kind}: {o.problem}" for o in self.outcomes if o.problem]

    def by_status(self) -> dict[str, int]:
        return dict(Counter(str(o.status) for o in self.outcomes))

    def by_kind(self) -> dict[str, dict[str, int]]:
        table: dict[str, Counter[str]] = {}
        for o in self.outcomes:
            table.setdefault(o.kind, Counter())[str(o.status)] += 1
        return {kind: dict(counts) for kind, counts in sorted(table.items())}


# ---- the load, the chaos, the samples ---------------------------------------------------------


def kernel_processes(worker_pid: int) -> list[psutil.Process]:
    """The worker's live kernels: its children running ipykernel (forked ones show so too)."""
    kernels = []
    for child in _children(worker_pid):
        with contextlib.suppress(psutil.Error):
            if "ipykernel" in " ".join(child.cmdline()) and _alive(child):
                kernels.append(child)
    return kernels


def fork_servers(worker_pid: int) -> list[psutil.Process]:
    """The worker's fork server (none when kernels are spawned)."""
    found = []
    for child in _children(worker_pid):
        with contextlib.suppress(psutil.Error):
            if FORK_SERVER_SCRIPT in " ".join(child.cmdline()):
                found.append(child)
    return found


def zombies(worker_pid: int) -> list[int]:
    """Children of the worker that died and were never reaped."""
    return [c.pid for c in _children(worker_pid) if not _alive(c)]


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=False)
    except psutil.Error:
        return []


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def sample(worker_pid: int) -> dict[str, float]:
    """Worker RSS (MiB), its open fds, its kernels' RSS (MiB) and count."""
    proc = psutil.Process(worker_pid)
    kernels = kernel_processes(worker_pid)
    kernel_rss = 0
    for kernel in kernels:
        with contextlib.suppress(psutil.Error):
            kernel_rss += kernel.memory_info().rss
    return {
        "worker_rss_mb": proc.memory_info().rss / 2**20,
        "worker_fds": float(proc.num_fds()),
        "kernels_rss_mb": kernel_rss / 2**20,
        "kernels": float(len(kernels)),
    }


@dataclass(frozen=True, slots=True)
class Chaos:
    """SIGKILL a random kernel every ``every`` seconds (uniform), sparing young ones.

    A kernel younger than ``min_age_seconds`` may still be starting; killing it is a start
    failure, which the pool answers with a doubling restart backoff (up to 30 s), so a
    chaos task that also kills starting kernels mostly measures that backoff. 0 kills any.
    """

    every: tuple[float, float] = (0.5, 1.0)
    min_age_seconds: float = 2.0


async def run_mix(
    url: str,
    worker_pid: int,
    *,
    requests: int | None = None,
    seconds: float | None = None,
    clients: int = 8,
    chaos: Chaos | None = None,
    seed: int = 0,
    max_seconds: float = 600.0,
    sample_seconds: float = 1.0,
) -> MixResult:
    """Send the mix until *requests* were answered or *seconds* passed (never past *max_seconds*)."""
    result = MixResult()
    started = time.monotonic()
    deadline = started + min(seconds if seconds is not None else max_seconds, max_seconds)
    limit = requests if requests is not None else 10**9
    counter = iter(range(limit))
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    timeout = httpx.Timeout(CLIENT_TIMEOUT_SECONDS)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:

        async def one_client() -> None:
            for index in counter:
                if time.monotonic() >= deadline:
                    return
                result.outcomes.append(await _send(client, plan(index, seed), started))

        async with asyncio.TaskGroup() as group:
            group.create_task(_sampler(worker_pid, result, stop, started, sample_seconds))
            if chaos is not None:
                group.create_task(_chaos(worker_pid, result, stop, chaos, seed))
            try:
                await asyncio.gather(*(one_client() for _ in range(clients)))
            finally:
                stop.set()
    result.seconds = time.monotonic() - started
    result.outcomes.sort(key=lambda o: o.index)
    return result


async def _send(client: httpx.AsyncClient, planned: Planned, t0: float) -> Outcome:
    begun = time.monotonic()
    try:
        response = await client.post("/v1/execute", files=planned.files)
    except httpx.HTTPError as exc:
        took = time.monotonic() - begun
        return Outcome(planned.index, planned.kind, None, begun - t0, took, f"no answer: {exc!r}")
    took = time.monotonic() - begun
    problem = await asyncio.to_thread(check, planned, response)
    return Outcome(planned.index, planned.kind, response.status_code, begun - t0, took, problem)


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep *seconds* unless *stop* is set first; True when it was set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


async def _chaos(
    worker_pid: int, result: MixResult, stop: asyncio.Event, chaos: Chaos, seed: int
) -> None:
    """Kill as *chaos* says until *stop*; every kernel seen is recorded (for leak checks)."""
    rng = random.Random(seed)
    while not await _wait(stop, rng.uniform(*chaos.every)):
        kernels = await asyncio.to_thread(kernel_processes, worker_pid)
        result.kernel_pids.update(k.pid for k in kernels)
        old = [k for k in kernels if _age(k) >= chaos.min_age_seconds]
        if old:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rng.choice(old).pid, signal.SIGKILL)
                result.kills += 1


def _age(process: psutil.Process) -> float:
    """Seconds since *process* started (0 when it is already gone)."""
    try:
        return time.time() - process.create_time()
    except psutil.Error:
        return 0.0


async def _sampler(
    worker_pid: int, result: MixResult, stop: asyncio.Event, t0: float, every: float
) -> None:
    while True:
        point = await asyncio.to_thread(sample, worker_pid)
        result.samples.append({"t": time.monotonic() - t0, **point})
        if await _wait(stop, every):
            return


# ---- the soak command -------------------------------------------------------------------------


async def wait_settled(url: str, worker_pid: int, kernels: int, timeout_seconds: float) -> bool:
    """Wait (bounded) until /health shows *kernels* idle and the worker has that many kernels."""
    deadline = time.monotonic() + timeout_seconds
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                pool = (await client.get("/health")).json()["pool"]
                live = await asyncio.to_thread(kernel_processes, worker_pid)
                if pool["kernels"].get("idle") == kernels and len(live) == kernels:
                    return True
            await asyncio.sleep(0.1)
    return False


def summary(result: MixResult) -> dict[str, Any]:
    """The report's numbers: counts, latency percentiles (ms), throughput, problems."""
    answered = [o.seconds for o in result.outcomes if o.status is not None]
    latency = {"all": summarize(answered)}
    for kind in MIX:  # answers with the kind's own status (200; 408 for timeouts)
        status = 408 if kind == "timeout" else 200
        latency[kind] = summarize(
            [o.seconds for o in result.outcomes if o.kind == kind and o.status == status]
        )
    return {
        "requests": len(result.outcomes),
        "seconds": round(result.seconds, 3),
        "requests_per_second": round(len(result.outcomes) / max(result.seconds, 1e-9), 2),
        "kills": result.kills,
        "by_status": result.by_status(),
        "by_kind": result.by_kind(),
        "latency_ms": {
            k: None
            if s is None
            else {
                "p50": round(s.p50 * 1000, 1),
                "p99": round(s.p99 * 1000, 1),
                "max": round(s.max * 1000, 1),
            }
            for k, s in latency.items()
        },
        "problems": result.problems[:50],
        "problem_count": len(result.problems),
    }


def chart(result: MixResult, path: Path) -> None:
    """Worker RSS, kernels' RSS and every request's latency (by status) over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (worker, kernels, latency) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    ts = [s["t"] for s in result.samples]
    worker.plot(ts, [s["worker_rss_mb"] for s in result.samples], color="#1f77b4")
    worker.set_ylabel("worker RSS (MiB)")
    worker.set_ylim(bottom=0)
    kernels.plot(ts, [s["kernels_rss_mb"] for s in result.samples], color="#2ca02c")
    kernels.set_ylabel("kernels RSS, all (MiB)")
    colors = {"200": "#1f77b4", "408": "#ff7f0e", "502": "#d62728"}
    for status in sorted({str(o.status) for o in result.outcomes}):
        points = [(o.started, o.seconds * 1000) for o in result.outcomes if str(o.status) == status]
        color = colors.get(status, "black")
        latency.scatter(*zip(*points, strict=True), s=3, color=color, label=status, alpha=0.6)
    latency.set_yscale("log")
    latency.set_ylabel("latency (ms)")
    latency.set_xlabel("seconds")
    latency.legend(fontsize=8, markerscale=3)
    for ax in (worker, kernels, latency):
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(f"soak: {len(result.outcomes)} requests, {result.kills} kernels killed")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class Worker:
    """``python -m kernel_worker`` on a free loopback port, stopped by PID."""

    def __init__(self, args: argparse.Namespace, run_dir: Path, log_path: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        argv = [sys.executable, "-m", "kernel_worker", "--host", "127.0.0.1",
                "--port", self.url.rsplit(":", 1)[1], "--pool-size", str(args.pool_size),
                "--spares", str(args.spares), "--queue-wait", "30", "--run-dir", str(run_dir),
                "--log-level", "warning"]  # fmt: skip
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, env=server_env(inline_matplotlib=True), cwd=ROOT, stderr=log
            )
        self.kernel_pids: set[int] = set()

    def wait_healthy(self, timeout_seconds: float) -> None:
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the worker exited with {self.proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError("the worker did not become healthy")

    def stop(self) -> list[int]:
        """SIGTERM (then SIGKILL); return the kernels that outlived it (killed now)."""
        self.kernel_pids |= {k.pid for k in kernel_processes(self.proc.pid)}
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        leaked = []
        for pid in sorted(self.kernel_pids):
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    proc.kill()
                    leaked.append(pid)
        return leaked


def _remove_if_empty(run_dir: Path) -> list[str]:
    """What the worker left in its run directory (removed when nothing)."""
    leftovers = sorted(p.name for p in run_dir.iterdir())
    if not leftovers:
        run_dir.rmdir()
    return leftovers


async def soak(args: argparse.Namespace) -> int:
    kernels = args.pool_size + args.spares
    results = Path(args.results_dir)
    await asyncio.to_thread(results.mkdir, parents=True, exist_ok=True)
    # where the worker puts run directories by default (a memory filesystem when there is one)
    where = default_run_root()
    run_dir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="soak-runs-", dir=where))
    worker = Worker(args, run_dir, results / "logs" / "soak.log")
    report: dict[str, Any] = {"settings": vars(args)}
    try:
        await asyncio.to_thread(worker.wait_healthy, 120)
        pid = worker.proc.pid
        warm = await run_mix(
            worker.url, pid, requests=10 * kernels, clients=kernels, chaos=None, seed=args.seed + 1
        )
        await wait_settled(worker.url, pid, kernels, 60)
        before = await asyncio.to_thread(sample, pid)
        chaos = None if args.no_chaos else Chaos((args.kill_min, args.kill_max), args.kill_min_age)
        result = await run_mix(worker.url, pid, seconds=args.minutes * 60, clients=args.clients,
                               chaos=chaos, seed=args.seed, max_seconds=args.minutes * 60)  # fmt: skip
        worker.kernel_pids |= result.kernel_pids
        settled = await wait_settled(worker.url, pid, kernels, 120)
        after = await asyncio.to_thread(sample, pid)
        unreaped = await asyncio.to_thread(zombies, pid)
    finally:
        leaked = await asyncio.to_thread(worker.stop)
    leftovers = await asyncio.to_thread(_remove_if_empty, run_dir)
    growth = after["worker_rss_mb"] - before["worker_rss_mb"]
    fd_growth = after["worker_fds"] - before["worker_fds"]
    report.update(summary(result))
    report.update(
        warmup_problems=warm.problems, settled=settled, before=before, after=after,
        rss_growth_mb=round(growth, 1), rss_bound_mb=args.rss_bound_mb,
        fd_growth=fd_growth, fd_slack=FD_SLACK, leaked_kernels=leaked, zombies=unreaped,
        run_dir_leftovers=leftovers, samples=result.samples,
    )  # fmt: skip
    text = json.dumps(report, indent=2) + "\n"
    await asyncio.to_thread((results / "soak.json").write_text, text)
    await asyncio.to_thread(chart, result, results / "soak.png")
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=2))
    failed = (report["problem_count"] or warm.problems or not settled or leftovers or leaked
              or unreaped or growth > args.rss_bound_mb or fd_growth > FD_SLACK)  # fmt: skip
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description="Mixed load + chaos soak."
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--spares", type=int, default=1)
    parser.add_argument(
        "--kill-min", type=float, default=0.5, help="seconds between kills, at least"
    )
    parser.add_argument(
        "--kill-max", type=float, default=1.0, help="seconds between kills, at most"
    )
    parser.add_argument(
        "--kill-min-age", type=float, default=2.0, help="spare kernels younger than this (0: none)"
    )
    parser.add_argument("--no-chaos", action="store_true", help="kill no kernels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rss-bound-mb", type=float, default=RSS_BOUND_MB,
                        help="largest worker RSS growth accepted (MiB)")  # fmt: skip
    parser.add_argument("--results-dir", default=str(ROOT / "bench" / "results"))
    sys.exit(asyncio.run(soak(parser.parse_args(argv))))


if __name__ == "__main__":
    main()
