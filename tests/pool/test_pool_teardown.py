"""A pool's start and close, failed or cancelled where they used to leave something behind.

Each test checks, by process id and by path, that nothing outlives the pool: real kernels.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import psutil
import pytest

from kernel_pool import KernelKind, KernelStartError, Pool, PoolConfig
from tests.conftest import alive


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


async def _new_processes(before: set[int], starting: asyncio.Task[None]) -> set[int]:
    """This process's descendants that ``before`` lacks, once ``starting`` made one."""
    deadline = time.monotonic() + 30
    while not (new := _descendants() - before):
        assert not starting.done(), "the start ended before it started a process"
        assert time.monotonic() < deadline, "no process was started"
        await asyncio.sleep(0.02)
    return new


def _other_tasks() -> set[asyncio.Task[object]]:
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}


async def test_a_cancelled_start_leaves_no_fork_server_or_private_folder(tmp_path: Path) -> None:
    slow_preload = KernelKind(preload="import time\ntime.sleep(60)")
    pool = Pool(PoolConfig(size=1, kind=slow_preload, runtime_dir=tmp_path))
    before = _descendants()
    starting = asyncio.create_task(pool.start())
    try:
        server = await _new_processes(before, starting)  # the fork server, running the preload
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        assert not [pid for pid in server if alive(pid)], "the fork server outlived the start"
        assert pool.private_dir is not None and not pool.private_dir.exists()
        assert not os.listdir(tmp_path)
        assert not _other_tasks()
    finally:
        await pool.aclose()


@pytest.mark.slow
async def test_a_start_deadline_passing_while_the_kernel_gets_ready_fails_in_time(
    tmp_path: Path,
) -> None:
    # the template takes a few seconds of the start (its preload), and a forked kernel
    # takes longer than what is left to answer kernel_info, though less than a whole
    # start timeout: the deadline passes while the pool waits for it to be ready
    timeout = 10.0
    preload = (
        "import time\n"
        "from ipykernel.kernelbase import Kernel\n"
        "_answer = Kernel.kernel_info_request\n"
        "async def _slowly(self, *args):\n"
        f"    time.sleep({timeout - 1})\n"
        "    return await _answer(self, *args)\n"
        "Kernel.kernel_info_request = _slowly\n"
        "time.sleep(3)\n"
    )
    config = PoolConfig(
        size=1,
        kind=KernelKind(preload=preload),
        runtime_dir=tmp_path,
        start_timeout_seconds=timeout,
        interrupt_grace_seconds=0.5,
    )
    pool = Pool(config)
    started = time.monotonic()
    try:
        with pytest.raises(KernelStartError, match="did not become ready in time"):
            await pool.start()
        assert time.monotonic() - started < timeout + 2
    finally:
        await pool.aclose()


async def test_a_cancelled_close_leaves_no_task_or_kernel(tmp_path: Path) -> None:
    pool = Pool(PoolConfig(size=1, runtime_dir=tmp_path))
    before = _descendants()
    await pool.start()
    try:
        processes = _descendants() - before  # the kernel and the fork server
        assert set(pool.kernel_pids().values()) <= processes
        async with pool.lease() as lease:
            result = await lease.execute(
                "import time\n"
                "class Slow:\n"
                "    def __del__(self):\n"
                "        time.sleep(60)\n"
                "slow = Slow()\n",
                deadline=time.monotonic() + 30,
            )
            assert result.ok, result.reply
        # the lease ended: its reset, which drops ``slow``, now runs for a minute in the
        # background, and closing the pool waits for it
        closing = asyncio.create_task(pool.aclose())
        await asyncio.sleep(0)  # one step: the close has begun, and waits
        assert pool.stats().closing
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert not _other_tasks(), "a pool task outlived its cancelled close"
        assert not [pid for pid in processes if alive(pid)], "a kernel outlived the close"
        assert pool.private_dir is not None and not pool.private_dir.exists()
    finally:
        await pool.aclose()
