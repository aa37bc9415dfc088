"""The benchmark's interleaved series: the fast targets take turns a block at a time."""

from __future__ import annotations

import asyncio

from bench.errors import Failure
from bench.measure import Attempt, RunOnce, interleaved_latency


def _target(name: str, calls: list[str], fail_at: int | None = None) -> RunOnce:
    async def run() -> Attempt:
        calls.append(name)
        await asyncio.sleep(0)
        count = calls.count(name)
        problem = "broken" if fail_at is not None and count >= fail_at else None
        return Attempt(seconds=count / 1000, status=200, problem=problem)

    return run


def _where(*names: str) -> dict[str, tuple[str, str, str]]:
    return {name: (name, "case", "request") for name in names}


async def test_targets_alternate_in_blocks_after_their_warm_up() -> None:
    calls: list[str] = []
    runs = {name: _target(name, calls) for name in ("raw", "ours")}
    failures: list[Failure] = []
    results = await interleaved_latency(
        runs, reps=6, burst=2, block=3, budget_seconds=60, where=_where(*runs), failures=failures
    )
    assert failures == []
    # warm-up (first + a burst of 2) per target, then blocks of 3, the order rotating
    assert calls[:6] == ["raw"] * 3 + ["ours"] * 3
    assert calls[6:] == ["raw"] * 3 + ["ours"] * 3 + ["ours"] * 3 + ["raw"] * 3
    for name in runs:
        assert results[name]["first"] == 0.001
        assert results[name]["latency"]["count"] == 6


async def test_a_failing_target_leaves_the_rotation_and_is_reported() -> None:
    calls: list[str] = []
    runs = {"raw": _target("raw", calls), "ours": _target("ours", calls, fail_at=3)}
    failures: list[Failure] = []
    results = await interleaved_latency(
        runs, reps=4, burst=0, block=2, budget_seconds=60, where=_where(*runs), failures=failures
    )
    assert [f.target for f in failures] == ["ours"]
    assert results["raw"]["latency"]["count"] == 4
    assert results["ours"]["latency"]["count"] == 1  # its second recorded request failed
