"""Case 8, churn: every n-th request kills its own kernel; how long do the others take?

The killing cell (``import os; os._exit(1)``) must be answered 502 by our worker (any 5xx
by the reference, which answers 500); every other request runs the trivial cell and is
timed. A dead kernel is replaced in the background; ``--spares 1`` keeps one extra warm
kernel so that the next request need not wait for that replacement, as long as kills come
no faster than kernels start. The series, side by side in one run:

* ``spares1``: our worker with ``--spares 1``, back to back (the issue's case, judged);
* ``spares1_paced``: the same with a pause between requests, so a kill comes less often
  than a kernel start takes (what the spare buys when it can keep up);
* ``ours``: the product worker without spares (``--spares 0``, every kill waits);
* ``fresh`` and ``reference``: a new kernel/process for every cell anyway (few requests).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from .cases import KILL_CASE, prepare_request, worker_cases
from .errors import Failure
from .measure import Attempt, HttpTarget, RunOnce, failure, http_runner
from .plan import BenchPlan
from .stats import ratio, summarize

OUR_KILL_STATUSES = frozenset({502})


def kill_ok(attempt: Attempt, statuses: frozenset[int] | None) -> bool:
    """The killing request got the error status expected of its target (None: any 5xx)."""
    if attempt.status is None:
        return False
    return attempt.status in statuses if statuses is not None else attempt.status >= 500


async def churn_series(
    run_ok: RunOnce, run_kill: RunOnce, *, every: int, requests: int, pace_seconds: float,
    kill_statuses: frozenset[int] | None, budget_seconds: float,
    where: tuple[str, str, str], failures: list[Failure],
) -> dict[str, Any]:  # fmt: skip
    """Serial requests, every ``every``-th one the killing cell; the others are timed.

    ``after_kill`` summarizes the request right after each kill (the one that may have to
    wait for a replacement kernel); ``latency`` all the non-killing ones, it included.
    """
    others: list[float] = []
    after_kill: list[float] = []
    statuses: Counter[str] = Counter()
    stop = time.monotonic() + budget_seconds
    killed = False
    for i in range(1, requests + 1):
        if others and time.monotonic() > stop:
            break
        kill = i % every == 0
        attempt = await (run_kill if kill else run_ok)()
        if kill:
            statuses[str(attempt.status)] += 1
            if not kill_ok(attempt, kill_statuses):
                failures.append(failure(where, _unexpected(attempt)))
                break
        elif attempt.problem is not None:
            failures.append(failure(where, attempt))
            break
        else:
            others.append(attempt.seconds)
            if killed:
                after_kill.append(attempt.seconds)
        killed = kill
        if pace_seconds:
            await asyncio.sleep(pace_seconds)
    summary = summarize(others)
    after = summarize(after_kill)
    return {
        "every": every,
        "pace_seconds": pace_seconds,
        "requests": len(others) + sum(statuses.values()),
        "kills": sum(statuses.values()),
        "kill_statuses": dict(statuses),
        "latency": summary.as_dict() if summary else None,
        "after_kill": after.as_dict() if after else None,
        "p99_over_p50": ratio(summary.p99, summary.p50) if summary else None,
    }


def _unexpected(attempt: Attempt) -> Attempt:
    problem = f"the killing cell was answered {attempt.status} ({attempt.problem or 'ok'})"
    return Attempt(attempt.seconds, attempt.status, problem, attempt.response)


async def run_churn(
    plan: BenchPlan, spares: HttpTarget, ours: HttpTarget, fresh: HttpTarget,
    reference: HttpTarget | None, failures: list[Failure],
) -> dict[str, Any]:  # fmt: skip
    """Every series of the module docstring, one after the other, each from a settled worker."""
    churn = plan.churn
    trivial = worker_cases(full=False)[0]
    ok_request = await asyncio.to_thread(prepare_request, trivial, None)
    kill_request = await asyncio.to_thread(prepare_request, KILL_CASE, None)
    # name: (target, requests, pause between requests)
    series: dict[str, tuple[HttpTarget, int, float]] = {
        "spares1": (spares, churn.requests, 0.0),
        "spares1_paced": (spares, churn.paced_requests, churn.pace_seconds),
        "ours": (ours, churn.requests, 0.0),
        "fresh": (fresh, churn.baseline_requests, 0.0),
    }
    if reference is not None:
        series["reference"] = (reference, churn.baseline_requests, 0.0)
    results: dict[str, Any] = {}
    for name, (target, requests, pace) in series.items():
        await target.settle()
        results[name] = await churn_series(
            http_runner(target, trivial, ok_request), http_runner(target, KILL_CASE, kill_request),
            every=churn.every, requests=requests, pace_seconds=pace,
            kill_statuses=None if name == "reference" else OUR_KILL_STATUSES,
            budget_seconds=churn.budget_seconds, failures=failures,
            where=(name, "churn", f"every {churn.every}th: {kill_request.description}"),
        )  # fmt: skip
        await target.settle()
    return {"every": churn.every, "series": results}
