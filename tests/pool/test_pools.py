"""Pools by kernel kind (:class:`kernel_pool.PoolSet`): made on first use, shared by the
callers that ask at once, stopped least recently used first under the kernel cap, the
default never."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from kernel_pool import KernelKind, KernelStartError, Lease, PoolBusy, PoolConfig, PoolSet
from tests.conftest import alive


async def run(lease: Lease, code: str) -> str:
    result = await lease.execute(code, deadline=time.monotonic() + 30)
    assert result.ok, result.reply
    return "".join(o.content.get("text", "") for o in result.outputs if o.msg_type == "stream")


def kind(name: str, **env: str) -> KernelKind:
    """A spawned kind whose kernels carry ``KIND_MARK=<name>``."""
    return KernelKind(name=name, fork=False, env={"KIND_MARK": name, **env})


def config_for(kind: KernelKind) -> PoolConfig:
    return PoolConfig(size=1, kind=kind)


MARK = "import os; print(os.environ.get('KIND_MARK'))"


async def test_a_kind_gets_its_own_pool_on_first_use_and_keeps_it() -> None:
    pools = PoolSet(PoolConfig(size=1), config_for)
    await pools.start()
    try:
        async with pools.lease() as lease:
            assert await run(lease, MARK) == "None\n"

        # callers asking for a new kind at once wait on one start
        async def use(name: str) -> str:
            async with pools.lease(kind(name)) as lease:
                return await run(lease, MARK)

        assert await asyncio.gather(use("a"), use("a")) == ["a\n", "a\n"]
        assert pools.pools_started == 1
        assert set(pools.pools()) == {"default", "a"}
        assert await use("a") == "a\n"
        assert pools.pools_started == 1  # warm after
    finally:
        await pools.aclose()
    for pool in pools.pools().values():
        assert not any(alive(pid) for pid in pool.kernel_pids().values() if pid)


async def test_least_recently_used_idle_pools_make_room_and_the_default_stays() -> None:
    pools = PoolSet(PoolConfig(size=1), config_for, max_kernels=2)
    await pools.start()
    try:
        for name in ("a", "b"):
            async with pools.lease(kind(name)) as lease:
                assert await run(lease, MARK) == f"{name}\n"
            a_pids = {} if name == "b" else dict(pools.pools()["a"].kernel_pids())
        # b took a's room: a's kernels are gone, the default's are not
        assert set(pools.pools()) == {"default", "b"}
        assert pools.pools_stopped == 1
        assert not any(alive(pid) for pid in a_pids.values() if pid)
        async with pools.lease() as lease:
            assert await run(lease, MARK) == "None\n"
    finally:
        await pools.aclose()


@pytest.mark.slow
async def test_a_new_pool_waits_for_a_used_one_to_become_idle() -> None:
    pools = PoolSet(PoolConfig(size=1), config_for, max_kernels=2)
    await pools.start()
    try:
        async with pools.lease(kind("a")) as held:
            waiting = asyncio.ensure_future(_mark_of(pools, "b"))
            await asyncio.sleep(1.0)  # time passing is the point: b does not start while a is held
            assert not waiting.done() and "a" in pools.pools()
            assert await run(held, MARK) == "a\n"
        assert await asyncio.wait_for(waiting, 60) == "b\n"
        assert set(pools.pools()) == {"default", "b"}
    finally:
        await pools.aclose()


async def _mark_of(pools: PoolSet, name: str) -> str:
    async with pools.lease(kind(name)) as lease:
        return await run(lease, MARK)


async def test_a_pool_larger_than_the_cap_is_refused() -> None:
    pools = PoolSet(PoolConfig(size=1), lambda k: PoolConfig(size=2, kind=k), max_kernels=2)
    await pools.start()
    try:
        with pytest.raises(PoolBusy, match="does not fit"):
            async with pools.lease(kind("big")):
                pass
    finally:
        await pools.aclose()


async def test_a_failed_start_fails_each_waiter_and_the_next_caller_tries_again() -> None:
    broken = KernelKind(name="broken", python=Path("/nonexistent/python"))
    pools = PoolSet(PoolConfig(size=1, start_timeout_seconds=20), config_for)
    await pools.start()
    try:

        async def use() -> None:
            async with pools.lease(broken):
                pass

        results = await asyncio.gather(use(), use(), return_exceptions=True)
        assert all(isinstance(r, KernelStartError) for r in results), results
        assert "broken" not in pools.pools()
        with pytest.raises(KernelStartError):
            await use()
        async with pools.lease() as lease:  # the default is untouched
            assert await run(lease, "print(1)") == "1\n"
    finally:
        await pools.aclose()


async def test_a_kind_on_another_interpreter_path_runs_it() -> None:
    """A kind naming an interpreter (here the worker's own, by path) and folders for the
    end of sys.path: the kernel runs that interpreter, with the folder after its own."""
    extra = os.path.join(os.path.dirname(__file__), "no-such-folder")
    python_kind = KernelKind(
        name="py", python=Path(sys.executable),
        python_path=(Path(extra),),
    )  # fmt: skip
    pools = PoolSet(PoolConfig(size=1), config_for)
    await pools.start()
    try:
        async with pools.lease(python_kind) as lease:
            out = await run(lease, "import sys; print(sys.executable); print(sys.path[-1])")
        assert out.split() == [sys.executable, extra]
    finally:
        await pools.aclose()
