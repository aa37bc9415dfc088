"""Case 3, a preloaded model: a cell that calls a model which takes ~2 s to build.

The model is built by :mod:`bench.model_preload` (``--preload`` for our workers). Side by
side, in this order:

* ``raw``: the bare kernels, the preload run once beforehand (untimed), then the call;
* ``ours``: ``--recycle reset --preload`` (the model stays warm across cells);
* ``fresh``: ``--recycle fresh --preload``, back to back: each kernel runs the preload when it
  starts, so a request pays for it whenever the replacements (kernel start + 2 s) have not
  kept up with the requests;
* ``fresh_paced``: the same worker, every kernel idle again before each request (untimed
  wait): what fresh mode costs when the replacements do keep up;
* ``reference``: no preload, so its cell is the preload's code followed by the call: it
  rebuilds the model every time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .cases import PRELOAD_FILE, preloaded_model_cases, prepare_request
from .errors import BenchError, Failure
from .measure import Attempt, HttpTarget, RunOnce, http_runner, latency, raw_runner
from .plan import BenchPlan
from .rawkernel import RawKernel
from .stats import case_ratios

PRELOAD_SECONDS = 120.0


async def preload_raw(kernels: list[RawKernel]) -> None:
    """Run the preload file once in each raw kernel (untimed), as ``--preload`` does."""
    source = await asyncio.to_thread(PRELOAD_FILE.read_text, encoding="utf-8")
    deadline = time.monotonic() + PRELOAD_SECONDS
    replies = await asyncio.gather(*(k.execute(source, deadline=deadline) for k in kernels))
    problems = [p for p in (r.problem() for r in replies) if p is not None]
    if problems:
        raise BenchError(f"the preload failed in a raw kernel: {problems[0]}")


def _paced(target: HttpTarget, run: RunOnce) -> RunOnce:
    async def paced() -> Attempt:
        await target.settle()  # untimed: every kernel (preload included) ready again
        return await run()

    return paced


async def run_preloaded_model(
    plan: BenchPlan, raw: list[RawKernel], ours: HttpTarget, fresh: HttpTarget,
    reference: HttpTarget | None, failures: list[Failure],
) -> dict[str, Any]:  # fmt: skip
    call, rebuild = preloaded_model_cases()
    request = await asyncio.to_thread(prepare_request, call, None)
    await preload_raw(raw)
    fresh_run = http_runner(fresh, call, request)
    # name: (runner, reps, warm-ups, burst, request description)
    series: dict[str, tuple[RunOnce, int, int, int, str]] = {
        "raw": (raw_runner(raw, call, call.source), plan.preload.ours, 1, len(raw),
                f"raw kernel (preloaded once): {call.source!r}"),
        "ours": (http_runner(ours, call, request), plan.preload.ours, 1, plan.kernels,
                 request.description),
        "fresh": (fresh_run, plan.preload.fresh, 0, 0, request.description),
        "fresh_paced": (_paced(fresh, fresh_run), plan.preload.fresh_paced, 0, 0,
                        request.description),
    }  # fmt: skip
    if reference is not None:
        ref_request = await asyncio.to_thread(prepare_request, rebuild, None)
        series["reference"] = (http_runner(reference, rebuild, ref_request),
                               plan.preload.reference, 0, 0, ref_request.description)  # fmt: skip
    settle = {"ours": ours, "fresh": fresh, "fresh_paced": fresh, "reference": reference}
    results: dict[str, Any] = {}
    for name, (run, reps, warmups, burst, description) in series.items():
        results[name] = await latency(
            run, reps=reps, warmups=warmups, burst=burst,
            budget_seconds=plan.case_budget_seconds,
            where=(name, call.name, description[:2000]), failures=failures,
        )  # fmt: skip
        target = settle.get(name)
        if target is not None:
            await target.settle()
    return {"label": call.label, "targets": results, "ratios": case_ratios(results)}
