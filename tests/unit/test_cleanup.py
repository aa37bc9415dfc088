"""What the worker stops or fails to make leaves nothing behind, and a cancellation of the
worker's own tasks is never swallowed on the way: stopped work has ended before its caller
goes on, a job whose submitter was cancelled goes at once with its run directory, and a run
directory that could not be made whole is removed."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from kernel_worker.cancellation import cancel_and_wait, unless_cancelled, wait_ended
from kernel_worker.errors import Cancelled
from kernel_worker.jobs import Execution, Job, JobQueue, JobResult, JobState
from kernel_worker.runs.directory import RUN_DIR_PREFIX, RunDir


async def _bounded(seconds: float, check: object) -> None:
    """Wait (at most ``seconds``) until ``check()`` is true."""
    assert callable(check)
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)


async def test_a_cancelled_waiter_waits_for_the_stopped_task_then_raises() -> None:
    cleaned = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.Event().wait()
        finally:  # cleanup that takes a while (a lease's exit, a thread joined)
            await asyncio.shield(asyncio.sleep(0.2))
            cleaned.set()

    task = asyncio.ensure_future(work())
    await asyncio.sleep(0)
    waiter = asyncio.ensure_future(cancel_and_wait(task))
    await asyncio.sleep(0.05)  # the waiter is waiting on the task's cleanup
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter  # the cancellation comes through, not swallowed
    assert cleaned.is_set() and task.cancelled()  # and only once the task had ended


async def test_waiting_for_work_to_end_does_not_cancel_it_nor_lose_the_waiters_cancel() -> None:
    """Work asked to stop some other way (a thread's stop event) is waited for, not
    cancelled; a cancellation of the waiter comes through once the work has ended."""
    stop = asyncio.Event()

    async def work() -> int:
        await stop.wait()
        await asyncio.sleep(0.2)  # what it does on its way out
        return 1

    task = asyncio.ensure_future(work())
    waiter = asyncio.ensure_future(wait_ended(task))
    await asyncio.sleep(0.05)
    stop.set()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert task.done() and task.result() == 1


async def test_work_stopped_by_its_cancel_event_is_cancelled_and_ended() -> None:
    cancel = asyncio.Event()
    ended = asyncio.Event()

    async def work() -> int:
        try:
            await asyncio.Event().wait()
        finally:
            ended.set()
        return 1

    running = asyncio.ensure_future(unless_cancelled(work(), cancel, "execution was cancelled"))
    await asyncio.sleep(0)
    cancel.set()
    with pytest.raises(Cancelled, match="execution was cancelled"):
        await running
    assert ended.is_set()
    assert await unless_cancelled(asyncio.sleep(0, 7), asyncio.Event(), "-") == 7


async def test_cancelling_the_caller_of_cancelled_work_is_not_swallowed() -> None:
    """The cancel event stops the work; while its cleanup runs, the caller is cancelled too
    (a shutdown): the caller ends cancelled, it does not go on as if nothing happened."""
    cancel = asyncio.Event()
    cleaning = asyncio.Event()
    went_on = False

    async def work() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaning.set()
            await asyncio.shield(asyncio.sleep(0.2))

    async def caller() -> None:
        nonlocal went_on
        with pytest.raises(Cancelled):
            await unless_cancelled(work(), cancel, "execution was cancelled")
        went_on = True

    task = asyncio.ensure_future(caller())
    await asyncio.sleep(0)
    cancel.set()
    await cleaning.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not went_on


def _queue_with_job(tmp_path: Path) -> tuple[JobQueue, Job]:
    """A job whose work runs until its execution is cancelled, as a cell's does."""

    async def runner(job: Job) -> JobResult:
        return await unless_cancelled(
            asyncio.sleep(3600, b"bundle"), job.execution.cancel, "execution was cancelled"
        )

    queue = JobQueue(max_queued=4, ttl_seconds=600)
    run_dir = RunDir.make(tmp_path)
    (run_dir.inputs / "df.arrow").write_bytes(b"x" * 1000)
    return queue, queue.submit(Execution("build-1"), run_dir, runner)


async def test_a_job_whose_submitter_is_cancelled_goes_at_once(tmp_path: Path) -> None:
    queue, job = _queue_with_job(tmp_path)

    async def submitter() -> None:
        with queue.awaited(job):
            await job.done.wait()

    waiting = asyncio.ensure_future(submitter())
    await asyncio.sleep(0.01)
    waiting.cancel()  # (a shutdown, a relay going away) before the job was claimed
    with pytest.raises(asyncio.CancelledError):
        await waiting
    # not kept for the 600 s TTL: cancelled, forgotten, its run directory removed
    await _bounded(10, lambda: not job.run_dir.root.exists())
    assert job.state is JobState.FAILED and isinstance(job.error, Cancelled)
    assert queue.get(job.job_id) is None
    await queue.aclose()


async def test_a_job_handed_off_is_kept_for_its_poller(tmp_path: Path) -> None:
    queue, job = _queue_with_job(tmp_path)
    queue.hand_off(job)  # answered 202: a poll will collect it
    queue.abandon(job)
    await asyncio.sleep(0.05)
    assert queue.get(job.job_id) is job and not job.execution.cancel.is_set()
    await queue.aclose()
    await _bounded(10, lambda: not job.run_dir.root.exists())


async def test_closing_the_queue_cancels_the_job_tasks_and_they_end_cancelled(
    tmp_path: Path,
) -> None:
    queue, job = _queue_with_job(tmp_path)
    await asyncio.sleep(0.01)
    await queue.aclose()
    assert job.task is not None and job.task.cancelled()  # the cancellation was not eaten
    assert isinstance(job.error, Cancelled)  # and a poller would have been told
    await _bounded(10, lambda: not job.run_dir.root.exists())


def _deep_folder(base: Path, length: int) -> Path:
    """A folder under ``base`` whose path is exactly ``length`` characters long."""
    path = str(base)
    while len(path) < length:
        left = length - len(path) - 1  # characters for the next name, after its "/"
        take = min(200, left)
        if left - take == 1:  # else only a "/" would fit after it
            take -= 1
        path += "/" + "d" * take
    folder = Path(path)
    folder.mkdir(parents=True)
    return folder


def test_a_run_directory_whose_folders_cannot_be_made_is_removed(tmp_path: Path) -> None:
    """Under a parent so deep that the run directory's path is as long as a path may be,
    the directory is made and its first folder cannot be (ENAMETOOLONG)."""
    name_length = len(f"{RUN_DIR_PREFIX}{os.getpid()}-") + 8  # 6 random bytes: 8 characters
    longest = os.pathconf(tmp_path, "PC_PATH_MAX") - 1  # (PATH_MAX counts the NUL)
    parent = _deep_folder(tmp_path, longest - 1 - name_length)
    with pytest.raises(OSError) as raised:
        RunDir.make(parent)
    assert raised.value.errno == errno.ENAMETOOLONG
    failed = Path(raised.value.filename)  # a folder inside the run directory, not the directory
    assert failed.parent.parent == parent and failed.parent.name.startswith(RUN_DIR_PREFIX)
    assert list(parent.iterdir()) == []  # the run directory was made, then removed
