"""Stopping work the worker started, without losing a cancellation of its own.

``task.cancel()`` followed by ``with suppress(CancelledError): await task`` swallows more
than the task's cancellation: when the awaiting task is itself cancelled during that wait
(a shutdown, a request torn down), its own ``CancelledError`` is suppressed too, so it goes
on as if nothing happened, and may go on while the task it stopped still runs. Here the
wait for a stopped task always lasts until the task has ended (its cleanup, such as a
lease's shielded exit, has run before the caller removes what it used), and a cancellation
that arrives meanwhile is raised once it has.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from .errors import Cancelled

T = TypeVar("T")


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks`` and wait until every one has ended.

    A cancellation of this wait does not cut it short; it is raised once the tasks have
    ended. What the tasks raised is left on them, not raised here.
    """
    for task in tasks:
        task.cancel()
    await wait_ended(*tasks)


async def wait_ended(*tasks: asyncio.Future[Any]) -> None:
    """Wait until every one of ``tasks`` has ended, without cancelling them.

    For work that ends by itself once asked to stop (a thread's, which cancelling its
    future would not stop): a cancellation of this wait does not cut it short; it is raised
    once the tasks have ended. What the tasks raised is left on them, not raised here.
    """
    pending = {task for task in tasks if not task.done()}
    interrupted: asyncio.CancelledError | None = None
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError as exc:  # ours, not theirs: asyncio.wait raises none
            interrupted = exc
    if interrupted is not None:
        raise interrupted


async def unless_cancelled(work: Coroutine[Any, Any, T], cancel: asyncio.Event, detail: str) -> T:
    """Run ``work`` until it ends or ``cancel`` is set; then it is cancelled and has ended.

    Raises:
        Cancelled: ``cancel`` was set first (with ``detail``).
        asyncio.CancelledError: This call was cancelled (after ``work`` ended).
    """
    running = asyncio.ensure_future(work)
    cancelled = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({running, cancelled}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # a lease cancelled mid-execution retires its kernel
        await cancel_and_wait(cancelled, *([] if running.done() else [running]))
    if running.cancelled():
        raise Cancelled(detail)
    return running.result()
