"""Load and chaos: a mixed load from 8 clients while a chaos task SIGKILLs random kernels.

The mix is ``bench/soak.py``'s (``python -m bench.soak --minutes 10`` runs it for longer):
trivial cells, JSON and Arrow inputs, cells that raise, short timeouts and matplotlib PNG
displays, each with a unique token that its answer must carry (in a variable and in stdout)
and no other request's. Every request must get a right answer: its own bundle, 408 for a
timeout cell, or 502 saying the kernel died; none may be lost. The chaos task kills a random
kernel every 0.5-1 s, sparing kernels younger than 2 s (maybe still starting: killing those
measures the pool's restart backoff instead, see ``bench.soak.Chaos``); about one kill a
second results.

Afterwards: the pool is back to full strength with every kernel idle, the worker's RSS grew
less than ``RSS_BOUND_MB`` (100 MiB) over its warm baseline, its open fds (/proc/<pid>/fd)
are within ``FD_SLACK`` (8) of that baseline, no killed kernel is left unreaped, the run
directory is empty, and (at stop) no kernel process seen during the run outlives the worker.

``CHAOS_REQUESTS`` (default 1,500, 25-90 s on 2 cores) sets the request count: enough for
the 10 kills the test requires even when the requests go fast (every killed kernel costs a
start plus pandas and matplotlib imports again; 1,000 took 22 s once and saw 9 kills). The
issue's 2,000 take a third longer; ``CHAOS_REQUESTS=2000 python -m pytest
tests/system/test_chaos.py`` runs them.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter

import httpx
import psutil
import pytest

from bench.soak import (
    FD_SLACK,
    MIX,
    RSS_BOUND_MB,
    Chaos,
    MixResult,
    fork_servers,
    kernel_processes,
    run_mix,
    sample,
    wait_settled,
    zombies,
)
from tests.conftest import start_worker

CHAOS_REQUESTS = int(os.environ.get("CHAOS_REQUESTS", "1500"))
POOL_SIZE = 2
SPARES = 1
KERNELS = POOL_SIZE + SPARES


@pytest.mark.timeout(400)
def test_mixed_load_while_kernels_are_killed(tmp_path_factory: pytest.TempPathFactory) -> None:
    worker = start_worker(
        tmp_path_factory, "--pool-size", str(POOL_SIZE), "--spares", str(SPARES),
        "--queue-wait", "30",
    )  # fmt: skip
    try:
        pid = worker.proc.pid
        # warm-up (no chaos): imports done in every kernel, then the baseline
        warm = asyncio.run(run_mix(worker.url, pid, requests=10 * KERNELS, clients=KERNELS, seed=1))
        assert not warm.problems, warm.problems
        assert asyncio.run(wait_settled(worker.url, pid, KERNELS, 60))
        before = sample(pid)

        result = asyncio.run(
            run_mix(worker.url, pid, requests=CHAOS_REQUESTS, clients=8, chaos=Chaos(),
                    max_seconds=300)
        )  # fmt: skip
        worker.kernel_pids |= result.kernel_pids
        check_answers(result)

        assert asyncio.run(wait_settled(worker.url, pid, KERNELS, 60)), "the pool did not refill"
        health = httpx.get(worker.url + "/health", timeout=10).json()
        assert health["status"] == "healthy" and health["active_executions"] == 0
        assert health["pool"]["kernels"]["idle"] == KERNELS, health["pool"]
        assert health["pool"]["retirements"]["died"] >= 1

        after = sample(pid)
        growth = after["worker_rss_mb"] - before["worker_rss_mb"]
        assert growth < RSS_BOUND_MB, f"worker RSS grew {growth:.0f} MiB under load"
        assert after["worker_fds"] <= before["worker_fds"] + FD_SLACK, (before, after)
        assert not zombies(pid), "killed kernels were never reaped"
        kernels = kernel_processes(pid)
        assert len(kernels) == KERNELS, [k.cmdline() for k in kernels]
        # nothing else: the kernels, and the fork server they came from
        expected = {k.pid for k in kernels} | {p.pid for p in fork_servers(pid)}
        assert {c.pid for c in psutil.Process(pid).children(recursive=True)} == expected
        # nothing but the worker's kept files (they go when it stops: see conftest)
        left = [p.name for p in worker.run_dir.iterdir() if not p.name.startswith("skw-kept-")]
        assert not left, f"files left in the run directory: {left}"
    finally:
        worker.stop()  # no kernel process (any seen during the run) or run directory left


def check_answers(result: MixResult) -> None:
    """Every request answered once, rightly; the chaos really happened."""
    answered = len(result.outcomes)
    assert answered == CHAOS_REQUESTS, f"{answered} of {CHAOS_REQUESTS} sent in the time budget"
    assert [o.index for o in result.outcomes] == list(range(CHAOS_REQUESTS)), "lost requests"
    assert not result.problems, "\n".join(result.problems[:20])
    statuses = Counter(o.status for o in result.outcomes)
    assert set(statuses) <= {200, 408, 502}, statuses  # check() already refused anything else
    assert result.kills >= 10, f"only {result.kills} kernels were killed"
    # one kernel runs one cell: a kill costs at most the one request it was running
    assert statuses[502] <= result.kills, (statuses, result.kills)
    for kind in MIX:
        kind_statuses = Counter(o.status for o in result.outcomes if o.kind == kind)
        good = kind_statuses[408 if kind == "timeout" else 200]
        assert good >= sum(kind_statuses.values()) / 2, (kind, kind_statuses)
