"""Each place that stops a helper task of its own keeps its caller's cancellation.

A caller cancelled while it waits for the helper to stop (the helper's cleanup takes a
while) must end cancelled, after the helper has ended, rather than go on as if nothing
happened. Each test cancels the caller during that wait; swallowing the cancellation would
let the caller reach the code after the block.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from kernel_worker.protocol.streaming import watching_for_disconnect
from kernel_worker.pull.output_stream import streaming

CLEANUP_SECONDS = 0.2


async def _slow_to_stop(ended: list[str], name: str) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        await asyncio.sleep(CLEANUP_SECONDS)  # its cleanup: cancelled callers must wait it out
        ended.append(name)


async def _cancel_during_cleanup(block: Callable[[], AbstractAsyncContextManager[Any]]) -> list[str]:
    order: list[str] = []

    async def caller() -> None:
        async with block():
            await asyncio.sleep(0.01)  # the helper is running
        order.append("caller went on")  # only when its cancellation was swallowed
        await asyncio.sleep(1)

    task = asyncio.create_task(caller())
    await asyncio.sleep(CLEANUP_SECONDS / 2)  # the block has ended; its helper is stopping
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return order


async def test_the_disconnect_watcher_keeps_the_callers_cancellation() -> None:
    ended: list[str] = []

    async def receive() -> dict[str, Any]:
        await _slow_to_stop(ended, "watcher")
        return {"type": "http.disconnect"}

    order = await _cancel_during_cleanup(lambda: watching_for_disconnect(receive))
    assert order == [] and ended == ["watcher"]


async def test_output_folder_streaming_keeps_the_callers_cancellation() -> None:
    ended: list[str] = []

    class Streamer:
        async def poll_forever(self, poll_seconds: float) -> None:
            await _slow_to_stop(ended, "streamer")

    def block() -> AbstractAsyncContextManager[Any]:
        return streaming(Streamer(), 0.1)  # type: ignore[arg-type]

    order = await _cancel_during_cleanup(block)
    assert order == [] and ended == ["streamer"]


async def test_the_helpers_own_cancellation_is_not_raised_to_a_caller_left_alone() -> None:
    ended: list[str] = []

    class Streamer:
        async def poll_forever(self, poll_seconds: float) -> None:
            await _slow_to_stop(ended, "streamer")

    async with streaming(Streamer(), 0.1):  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
    assert ended == ["streamer"]


