"""Large bundles written while they are sent: no bundle file, no second pass over the data.

A bundle too large to build in memory used to be written to ``bundle.tar.gz`` in the run
directory and then streamed from there: every output byte was written twice and read twice
more. :class:`BundleStream` runs the bundle writer in a thread instead, handing its output
to the response in chunks of about 1 MiB, at most ``depth`` of them in flight (memory stays
bounded whatever the bundle's size). The response's pace is the writer's pace.
:class:`BundleStreamResponse` sends one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import BinaryIO, cast

from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..cancellation import cancel_and_wait, wait_ended

log = logging.getLogger(__name__)

# Buffers just under 1 MiB: from 1 MiB up the worker's malloc (cli.py) maps fresh pages for
# each one instead of reusing warm heap memory. Bundle chunks, reads and batches use it.
CHUNK_BYTES = 960 * 1024
_END = object()


class _Stopped(Exception):
    """The consumer went away: the writer stops at its next write."""


class _Handoff:
    """The writer's file object: collects writes into chunks and hands each to the loop."""

    def __init__(
        self,
        deliver: Callable[[object], None],
        slots: threading.Semaphore,
        stop: threading.Event,
        chunk_bytes: int,
    ) -> None:
        self._deliver = deliver
        self._slots = slots
        self._stop = stop
        self._chunk_bytes = chunk_bytes
        self._pending = bytearray()
        self.written = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        length = len(data)
        if length >= self._chunk_bytes // 4 and isinstance(data, bytes):
            self.flush_pending()
            self.hand(data)  # big enough to go as a chunk of its own: no copy
        else:
            self._pending += data
            if len(self._pending) >= self._chunk_bytes:
                self.flush_pending()
        self.written += length
        return length

    def flush(self) -> None:
        """Chunks go out when full (and on :meth:`flush_pending`)."""

    def flush_pending(self) -> None:
        if self._pending:
            self.hand(bytes(self._pending))
            self._pending.clear()

    def hand(self, item: object) -> None:
        """Give ``item`` to the loop once a slot is free (raises :class:`_Stopped`)."""
        while not self._slots.acquire(timeout=0.5):
            if self._stop.is_set():
                raise _Stopped
        if self._stop.is_set():
            raise _Stopped
        try:
            self._deliver(item)
        except RuntimeError:  # the loop is closed
            raise _Stopped from None


class BundleStream:
    """A bundle produced by ``write(fileobj)`` in a thread, read with :meth:`chunks`.

    ``length``: how many bytes ``write`` will write, when known in advance (the response
    then carries it). ``on_bytes`` is told the size of every chunk as it is handed out.
    """

    def __init__(
        self,
        write: Callable[[BinaryIO], object],
        *,
        length: int | None = None,
        on_bytes: Callable[[int], object] | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        depth: int = 4,
    ) -> None:
        self._write = write
        self.length = length
        self._on_bytes = on_bytes
        self._chunk_bytes = chunk_bytes
        self._depth = depth
        self._started = False

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The bundle's bytes, in order; the writer's exception, if it fails, at its point.

        Closing the iterator early stops the writer; it is joined before this returns.
        Can be iterated once.
        """
        if self._started:
            raise RuntimeError("a bundle stream can be read once")
        self._started = True
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        slots = threading.Semaphore(self._depth)
        stop = threading.Event()
        finished = asyncio.Event()

        def deliver(item: object) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        handoff = _Handoff(deliver, slots, stop, self._chunk_bytes)

        def produce() -> None:
            try:
                self._write(cast(BinaryIO, handoff))
                handoff.flush_pending()
                handoff.hand(_END)
            except _Stopped:
                pass
            except BaseException as exc:
                with contextlib.suppress(_Stopped):
                    handoff.hand(exc)
            finally:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                    loop.call_soon_threadsafe(finished.set)

        writer = threading.Thread(target=produce, name="bundle-stream", daemon=True)
        writer.start()
        try:
            while True:
                item = await queue.get()
                slots.release()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                chunk = cast(bytes, item)
                if self._on_bytes is not None:
                    self._on_bytes(len(chunk))
                yield chunk
        finally:
            stop.set()
            for _ in range(self._depth):  # wake a writer waiting for a slot
                slots.release()
            # the writer stops at its next write; cancelled again meanwhile, this still
            # waits for it (then raises), so nothing reads the run after its removal
            await wait_ended(asyncio.ensure_future(finished.wait()))
            writer.join()  # (it set the event on its way out: only its exit is left)


@contextlib.asynccontextmanager
async def watching_for_disconnect(
    receive: Receive, on_gone: Callable[[], None] | None = None
) -> AsyncIterator[asyncio.Event]:
    """An event set when the client goes away (the request body already read), and
    ``on_gone`` called then; the watcher stops on exit."""
    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()
        if on_gone is not None:
            on_gone()

    watcher = asyncio.ensure_future(watch())
    try:
        yield gone
    finally:
        await cancel_and_wait(watcher)


class BundleStreamResponse(Response):
    """A large bundle, sent as it is written (no bundle file): with its length when known
    in advance (a stored bundle), else chunked.

    The run directory's removal (``background``) runs however the response ends: complete,
    the client gone mid-way, or the writer failing (the response is then cut short: a
    client sees an incomplete body, never a truncated bundle that looks whole).
    """

    media_type = "application/x-tar"

    def __init__(
        self, stream: BundleStream, headers: Mapping[str, str], background: BackgroundTask
    ) -> None:
        self.stream = stream
        self.status_code = 200
        self.background = background
        headers = dict(headers)
        if stream.length is not None:  # the server then checks that exactly this many go out
            headers["content-length"] = str(stream.length)
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with watching_for_disconnect(receive) as gone:
            await self._send(send, gone)

    async def _send(self, send: Send, gone: asyncio.Event) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async with contextlib.aclosing(self.stream.chunks()) as chunks:
                async for chunk in chunks:
                    if gone.is_set():
                        log.info("client went away during the bundle: stopped sending")
                        return
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception:
            log.exception("writing the bundle failed mid-response: the response is cut short")
            raise
        finally:
            if self.background is not None:
                await self.background()
