"""A client for a running kernel worker: send a cell with Python values, get Python values back.

::

    from kernel_worker.client.session import Client

    with Client("http://127.0.0.1:9000") as worker:
        result = worker.run("total = int(df['a'].sum())\\nprint(total)", {"df": frame})
        result.raise_for_error()
        result.outputs["total"], result.stdout, result.displays

:class:`AsyncClient` is the same with ``await``. Both speak the executor protocol v1 the way
Strata's own client does: one multipart ``POST /v1/execute`` (the envelope plus one file part
per input), a ``202`` job URL polled until it answers, the answer a gzipped tar bundle. Values
are encoded and decoded with the worker's own codecs (:mod:`kernel_worker.agent.codecs`), so a
DataFrame goes as Arrow IPC and comes back a DataFrame. Outputs are decoded only when read:
decoding a ``pickle/object`` output unpickles it, so read outputs only from workers you trust
as much as the code you send them.

A worker that answers ``503`` with ``Retry-After`` (all its executions taken, or shutting
down) is waited out and sent the cell again, within the same deadline as a queued cell; each
wait is logged (logger ``kernel_worker.client``) and reported to ``on_progress``, which also
hears, about once a second, how a queued or running cell is getting on (see
:mod:`kernel_worker.client.progress`).

Everything it raises on purpose is a ``ClientError``: the tree is drawn in
:mod:`kernel_worker.client.errors`, and every class is importable from here.

This module holds the two clients and their I/O: the ``POST`` with its ``503`` retries, the
job polling, the progress watch, the cancel. What is sent and how answers are read is
:mod:`kernel_worker.client.exchange`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping

import httpx

from .errors import (
    CellError,
    CellTimeout,
    ClientError,
    InputEncodingError,
    OutputDecodingError,
    ProtocolError,
    RequestFailed,
    WorkerUnreachable,
)
from .exchange import (
    EXECUTE_PATH,
    Request,
    base_url,
    build_request,
    cancel_path,
    detail_of,
    headers_for,
    past_deadline,
    poll_delays,
    read_answer,
    read_health,
    read_poll,
    translated,
)
from .progress import (
    WATCH_INTERVAL_SECONDS,
    ConsoleWatch,
    Progress,
    ProgressCallback,
    busy_wait,
)
from .values import (
    CellResult,
    Display,
    EncodedInput,
    InputPart,
    Outputs,
    encode_inputs,
    parse_bundle,
)

__all__ = [
    "AsyncClient",
    "CellError",
    "CellResult",
    "CellTimeout",
    "Client",
    "ClientError",
    "Display",
    "EncodedInput",
    "InputEncodingError",
    "OutputDecodingError",
    "Outputs",
    "Progress",
    "ProtocolError",
    "RequestFailed",
    "WorkerUnreachable",
]

DEFAULT_URL = "http://127.0.0.1:9000"
_CANCEL_TIMEOUT_SECONDS = 5.0
_WATCH_TIMEOUT_SECONDS = 2.0
log = logging.getLogger("kernel_worker.client")


class _ClientBase:
    """What both clients hold: where the worker is, and the timeouts."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout_seconds: float = 30.0,
        queue_timeout_seconds: float = 600.0,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self.base_url = base_url(url)
        self.timeout_seconds = timeout_seconds
        self.queue_timeout_seconds = queue_timeout_seconds
        self.on_progress = on_progress
        self._headers = headers_for(token)
        self._connect()

    def _busy(self, watch: ConsoleWatch, response: httpx.Response, wait: float) -> None:
        """Say that the worker is busy and when the cell is sent again."""
        detail = detail_of(response)
        log.warning("the worker is busy (503: %s); sending again in %gs", detail, wait)
        if self.on_progress is not None:
            self.on_progress(Progress("busy", watch.elapsed(), detail, retry_in_seconds=wait))

    def _connect(self) -> None:
        raise NotImplementedError

    def _request(
        self,
        source: str,
        parts: list[InputPart],
        timeout: float | None,
        env: Mapping[str, str] | None,
    ) -> Request:
        return build_request(
            source,
            parts,
            timeout_seconds=self.timeout_seconds if timeout is None else timeout,
            env=env,
            queue_timeout_seconds=self.queue_timeout_seconds,
        )


class Client(_ClientBase):
    """A synchronous client for one worker.

    *url* is the worker's root (``http://127.0.0.1:9000``) or the execute URL a Strata
    notebook uses (``…/v1/execute``); *token* is sent as a bearer token. A cell's timeout
    defaults to *timeout_seconds*; a queued cell (``202``) is waited for up to
    *queue_timeout_seconds* more, then cancelled; a busy worker (``503`` with
    ``Retry-After``) is sent the cell again within that time. *on_progress*, when given, is
    called with a :class:`Progress` while a cell waits or runs (from a background thread).
    """

    _http: httpx.Client

    def _connect(self) -> None:
        self._http = httpx.Client(base_url=self.base_url, headers=self._headers)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def health(self) -> dict[str, object]:
        """``GET /health``: capabilities and pool state (also while unhealthy: 503)."""
        with translated("GET /health"):
            return read_health(self._http.get("health", timeout=10.0))

    def run(
        self,
        source: str,
        inputs: Mapping[str, object] | None = None,
        *,
        timeout_seconds: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CellResult:
        """Run *source* with *inputs* bound as variables. A cell that raises is a result;
        everything else that goes wrong raises a :class:`ClientError`.
        """
        started = time.perf_counter()
        request = self._request(source, encode_inputs(inputs or {}), timeout_seconds, env)
        try:
            body = self._exchange(request)
        except RequestFailed:  # the worker's final word: nothing runs
            raise
        except BaseException:  # interrupted, timed out, cut off: stop the cell if it runs
            with contextlib.suppress(httpx.HTTPError):
                self._http.post(cancel_path(request), timeout=_CANCEL_TIMEOUT_SECONDS)
            raise
        return parse_bundle(body, time.perf_counter() - started)

    def _exchange(self, request: Request) -> bytes:
        watch = ConsoleWatch(request.build_id)
        with self._watching(watch):
            answer = read_answer(self._post(request, watch), self.base_url)
            if isinstance(answer, bytes):
                return answer
            for delay in poll_delays(request.deadline):
                time.sleep(delay)  # the protocol's job polling: the worker cannot push
                with translated("polling the job"):
                    bundle = read_poll(self._http.get(answer, timeout=30.0))
                if bundle is not None:
                    return bundle
        raise past_deadline()

    def _post(self, request: Request, watch: ConsoleWatch) -> httpx.Response:
        """POST the cell; a busy worker's 503 is waited out (bounded) and sent again."""
        while True:
            with translated("POST /v1/execute"):
                response = self._http.post(
                    EXECUTE_PATH[1:], files=request.files, timeout=request.http_timeout_seconds
                )
            wait = busy_wait(response, request.deadline)
            if wait is None:
                return response
            self._busy(watch, response, wait)
            time.sleep(wait)

    @contextlib.contextmanager
    def _watching(self, watch: ConsoleWatch) -> Iterator[None]:
        """Report progress from a thread while the cell is waited for (with *on_progress*)."""
        if self.on_progress is None:
            yield
            return
        stop = threading.Event()
        thread = threading.Thread(
            target=self._watch, args=(watch, self.on_progress, stop), daemon=True
        )
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _watch(self, watch: ConsoleWatch, report: ProgressCallback, stop: threading.Event) -> None:
        with httpx.Client(
            base_url=self.base_url, headers=self._headers, timeout=_WATCH_TIMEOUT_SECONDS
        ) as http:
            while not stop.wait(WATCH_INTERVAL_SECONDS):
                try:
                    response: httpx.Response | None = http.get(watch.path, params=watch.offsets)
                except httpx.HTTPError:
                    response = None
                if stop.is_set():  # answered meanwhile: the result says the rest
                    return
                report(watch.report(response))


class AsyncClient(_ClientBase):
    """:class:`Client` for asyncio: the same arguments, coroutines instead of calls.

    Inputs are encoded and bundles read in a thread, off the event loop. Cancelling a
    ``run`` cancels the cell on the worker too.
    """

    _http: httpx.AsyncClient

    def _connect(self) -> None:
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self._headers)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def health(self) -> dict[str, object]:
        """As :meth:`Client.health`."""
        with translated("GET /health"):
            return read_health(await self._http.get("health", timeout=10.0))

    async def run(
        self,
        source: str,
        inputs: Mapping[str, object] | None = None,
        *,
        timeout_seconds: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CellResult:
        """As :meth:`Client.run`."""
        started = time.perf_counter()
        parts = await asyncio.to_thread(encode_inputs, dict(inputs or {}))
        request = self._request(source, parts, timeout_seconds, env)
        try:
            body = await self._exchange(request)
        except RequestFailed:
            raise
        except BaseException:
            # Shielded, so a cancelled run still reaches the worker (bounded by its timeout).
            await asyncio.shield(self._cancel(request))
            raise
        return await asyncio.to_thread(parse_bundle, body, time.perf_counter() - started)

    async def _exchange(self, request: Request) -> bytes:
        watch = ConsoleWatch(request.build_id)
        async with self._watching(watch):
            answer = read_answer(await self._post(request, watch), self.base_url)
            if isinstance(answer, bytes):
                return answer
            for delay in poll_delays(request.deadline):
                await asyncio.sleep(delay)  # the protocol's job polling: the worker cannot push
                with translated("polling the job"):
                    bundle = read_poll(await self._http.get(answer, timeout=30.0))
                if bundle is not None:
                    return bundle
        raise past_deadline()

    async def _post(self, request: Request, watch: ConsoleWatch) -> httpx.Response:
        """As :meth:`Client._post`."""
        while True:
            with translated("POST /v1/execute"):
                response = await self._http.post(
                    EXECUTE_PATH[1:], files=request.files, timeout=request.http_timeout_seconds
                )
            wait = busy_wait(response, request.deadline)
            if wait is None:
                return response
            self._busy(watch, response, wait)
            await asyncio.sleep(wait)

    @contextlib.asynccontextmanager
    async def _watching(self, watch: ConsoleWatch) -> AsyncIterator[None]:
        """Report progress from a task while the cell is waited for (with *on_progress*)."""
        if self.on_progress is None:
            yield
            return
        task = asyncio.ensure_future(self._watch(watch, self.on_progress))
        try:
            yield
        finally:
            task.cancel()
            await asyncio.wait([task])
            if not task.cancelled() and task.exception() is not None:  # on_progress raised
                log.warning("on_progress raised: %r", task.exception())

    async def _watch(self, watch: ConsoleWatch, report: ProgressCallback) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL_SECONDS)
            try:
                response: httpx.Response | None = await self._http.get(
                    watch.path, params=watch.offsets, timeout=_WATCH_TIMEOUT_SECONDS
                )
            except httpx.HTTPError:
                response = None
            report(watch.report(response))

    async def _cancel(self, request: Request) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self._http.post(cancel_path(request), timeout=_CANCEL_TIMEOUT_SECONDS)
