"""Each place that stops a helper task of its own keeps its caller's cancellation.

A caller cancelled while it waits for the helper to stop (the helper's cleanup takes a
while) must end cancelled, after the helper has ended, rather than go on as if nothing
happened. Each test cancels the caller during that wait; swallowing the cancellation would
let the caller reach the code after the block.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
from fastapi import FastAPI

from kernel_worker.http import relay
from kernel_worker.http.lifespan import _start_unless_stopped
from kernel_worker.http.relay import serve_relay
from kernel_worker.protocol.streaming import watching_for_disconnect
from kernel_worker.pull.output_stream import streaming

CLEANUP_SECONDS = 0.2
_NO_APP: Any = None  # the relay is never reached: no request comes to an app


async def _slow_to_stop(ended: list[str], name: str) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        await asyncio.sleep(CLEANUP_SECONDS)  # its cleanup: cancelled callers must wait it out
        ended.append(name)


async def _cancel_during_cleanup(
    block: Callable[[], AbstractAsyncContextManager[Any]],
) -> list[str]:
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


class _SlowToStopPool:
    """A pool whose start, once cancelled, stops the kernels it had begun: a while, and
    through the further cancellations a start cut short gets."""

    def __init__(self, ended: list[str]) -> None:
        self.ended = ended

    async def start(self) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            loop = asyncio.get_running_loop()
            end = loop.time() + 0.3
            while loop.time() < end:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(end - loop.time())
            self.ended.append("start")


def _starting(ended: list[str], stop: asyncio.Event) -> asyncio.Task[bool]:
    pool: Any = _SlowToStopPool(ended)
    return asyncio.create_task(_start_unless_stopped(pool, stop))


async def test_a_lifespan_cancelled_while_the_pool_starts_waits_for_the_start() -> None:
    ended: list[str] = []
    starting = _starting(ended, asyncio.Event())
    await asyncio.sleep(0.01)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert ended == ["start"]


async def test_a_lifespan_cancelled_while_a_stopped_start_ends_waits_for_it() -> None:
    ended: list[str] = []
    stop = asyncio.Event()
    starting = _starting(ended, stop)
    await asyncio.sleep(0.01)
    stop.set()  # a signal while the kernels start: the start is cancelled
    await asyncio.sleep(0.05)
    starting.cancel()  # and the lifespan itself, while the start stops its kernels
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert ended == ["start"]


async def test_a_start_stopped_by_a_signal_is_not_a_cancellation_of_the_lifespan() -> None:
    ended: list[str] = []
    stop = asyncio.Event()
    starting = _starting(ended, stop)
    await asyncio.sleep(0.01)
    stop.set()
    assert await starting is False
    assert ended == ["start"]


async def _request_with_shielded_cleanup(ended: list[str]) -> None:
    """A forwarded request: cancelled, its cleanup (the app's) runs shielded."""
    try:
        await asyncio.Event().wait()
    finally:
        await asyncio.shield(asyncio.sleep(CLEANUP_SECONDS))
        ended.append("request")


async def test_the_relay_cancelled_twice_waits_for_its_requests_cleanup() -> None:
    """A second cancellation of the relay (a second signal) while its requests clean up is
    not passed on to them, which would end them with their shielded cleanup still running."""
    ended: list[str] = []
    request = asyncio.create_task(_request_with_shielded_cleanup(ended))
    serving = asyncio.create_task(serve_relay("ws://127.0.0.1:1", _NO_APP, None, {request}))
    await asyncio.sleep(0.01)  # dialling a relay that is not there, again and again
    serving.cancel()
    await asyncio.sleep(CLEANUP_SECONDS / 2)  # the request is cleaning up
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving
    assert ended == ["request"]


async def test_a_connected_worker_cancelled_twice_waits_for_the_relay_to_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ended: list[str] = []

    async def serving(*args: object) -> None:
        await _request_with_shielded_cleanup(ended)

    monkeypatch.setattr(relay, "serve_relay", serving)
    running = asyncio.create_task(relay.run_connected(FastAPI(), "ws://127.0.0.1:1", None, 1))
    await asyncio.sleep(0.01)
    running.cancel()
    await asyncio.sleep(CLEANUP_SECONDS / 2)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert ended == ["request"]
