"""The pool's background tasks: the group that owns them, and cleanup that cannot be cut short.

Every reset, kill, kernel start and the refill loop runs as a task of one
:class:`PoolTasks`: nothing is fire-and-forget. A task that fails is logged on its owner's
logger; closing the pool drains the group within a bound (kernel starts are cancelled at
once) and cancels what is left; a cancelled close cancels every task and waits for each.
:func:`finish` runs cleanup to its end even when the wait for it is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any


async def finish(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` to its end even when this wait is cancelled (cleanup must not be cut
    short); such a cancellation is raised once ``work`` has ended."""
    task = asyncio.ensure_future(work)
    interrupted: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:  # ours: asyncio.wait raises none of the task's
            interrupted = exc
    if interrupted is not None:
        raise interrupted
    task.result()


class PoolTasks:
    """The background tasks of one pool, kernel starts among them."""

    def __init__(self, log: logging.Logger) -> None:
        """``log``: where a task that failed is reported (the owner's logger)."""
        self._log = log
        self._tasks: set[asyncio.Task[Any]] = set()
        self._starts: set[asyncio.Task[Any]] = set()  # kernel starts among them

    def spawn(self, coro: Coroutine[Any, Any, Any], *, start: bool = False) -> None:
        """Run a background task owned by the group (cancelled and awaited by the pool's
        close); ``start``: a kernel start, which closing the pool cancels at once."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        if start:
            self._starts.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._starts.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._log.error("pool background task failed", exc_info=task.exception())

    async def drain(self, deadline: float) -> None:
        """Let resets and kills finish by ``deadline``; cancel what is still running then.

        Kernel starts under way are cancelled at once (each kills its kernel): a
        replacement's preload may take minutes, and no kernel is wanted any more.
        """
        for task in self._starts:
            task.cancel()
        while self._tasks:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for task in self._tasks:
                    task.cancel()
                await asyncio.gather(*self._tasks, return_exceptions=True)
                return
            await asyncio.wait(set(self._tasks), timeout=remaining)

    async def cancel_all(self) -> None:
        """Cancel every task and wait for each to end (what a cancelled close still does)."""
        while self._tasks:  # a task that ends may spawn another (a retirement's kill)
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
