"""Waiting on state, never for a fixed time: a bounded poll of a condition, sync and async.

A test that sleeps for a fixed time to let something happen is slow where the machine is
fast and flaky where it is slow; these return as soon as the condition holds and fail with
``message`` (and what the condition last saw) once ``seconds`` have passed without it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

INTERVAL_SECONDS = 0.02


def wait_until(condition: Callable[[], T], seconds: float, message: str) -> T:
    """Poll ``condition`` until it returns something true; return that value."""
    deadline = time.monotonic() + seconds
    while not (seen := condition()):
        assert time.monotonic() < deadline, f"{message} (last seen: {seen!r})"
        time.sleep(INTERVAL_SECONDS)
    return seen


async def eventually(condition: Callable[[], T], seconds: float, message: str) -> T:
    """:func:`wait_until` for a coroutine: polls without blocking the event loop."""
    deadline = time.monotonic() + seconds
    while not (seen := condition()):
        assert time.monotonic() < deadline, f"{message} (last seen: {seen!r})"
        await asyncio.sleep(INTERVAL_SECONDS)
    return seen
