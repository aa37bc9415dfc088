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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass

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
_EXECUTE_PATH = "/v1/execute"
_PROTOCOL = "v1"
_NOTEBOOK_PROTOCOL = "notebook-cell-v1"
_TRANSFORM_REF = "notebook_cell@v1"
_PENDING_STATES = frozenset({"queued", "provisioning", "starting", "running"})
_CANCEL_TIMEOUT_SECONDS = 5.0
_WATCH_TIMEOUT_SECONDS = 2.0
log = logging.getLogger("kernel_worker.client")


# ---- the exchange, without I/O -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Request:
    """One execute request, ready to send."""

    build_id: str
    files: list[tuple[str, tuple[str, bytes, str]]]
    http_timeout_seconds: float
    deadline: float  # monotonic: give up (and cancel) if no bundle by then


def _request(
    source: str,
    parts: list[InputPart],
    *,
    timeout_seconds: float,
    env: Mapping[str, str] | None,
    queue_timeout_seconds: float,
) -> _Request:
    build_id = f"client-{uuid.uuid4().hex[:16]}"
    envelope = {
        "protocol_version": _PROTOCOL,
        "build_id": build_id,
        "transform": {
            "ref": _TRANSFORM_REF,
            "params": {
                "source": source,
                "timeout_seconds": timeout_seconds,
                "env": dict(env or {}),
            },
        },
        "inputs": [part.descriptor for part in parts],
    }
    files = [("metadata", ("metadata.json", json.dumps(envelope).encode(), "application/json"))]
    files += [(p.file_name, (p.file_name, p.data, "application/octet-stream")) for p in parts]
    return _Request(
        build_id=build_id,
        files=files,
        # As Strata's client: the cell's time plus slack, never under 30 s without a byte.
        http_timeout_seconds=max(timeout_seconds + 5.0, 30.0),
        deadline=time.monotonic() + queue_timeout_seconds + timeout_seconds + 5.0,
    )


def _base_url(url: str) -> httpx.URL:
    """The worker's root URL, from either it or the full ``…/v1/execute`` URL Strata uses."""
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"not an http(s) URL: {url!r}")
    path = parsed.path.rstrip("/")
    for suffix in (_EXECUTE_PATH, "/v1/notebook-execute"):
        path = path.removesuffix(suffix)
    return parsed.copy_with(path=path + "/", query=None, fragment=None)


def _headers(token: str | None) -> dict[str, str]:
    headers = {"x-strata-executor-protocol": _PROTOCOL}
    if token:
        headers["authorization"] = f"Bearer {token}"
    return headers


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("detail", "error"):
            if body.get(key):
                value = body[key]
                return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(body)[:500]


def _failure(status_code: int, detail: str) -> ClientError:
    if status_code in (408, 504):
        return CellTimeout(status_code, detail)
    return RequestFailed(status_code, detail)


def _bundle_of(response: httpx.Response) -> bytes:
    """The bundle bytes of a 200 answer, after the protocol headers are checked."""
    for header, expected in (
        ("x-strata-executor-protocol", _PROTOCOL),
        ("x-strata-notebook-executor-protocol", _NOTEBOOK_PROTOCOL),
    ):
        sent = response.headers.get(header)
        if sent is not None and sent != expected:
            raise ProtocolError(f"the worker speaks {header} {sent!r}, not {expected!r}")
    return response.content


def _job_url(response: httpx.Response, base: httpx.URL) -> httpx.URL:
    """The job URL of a 202 answer; it must stay on the worker (the token goes with it)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    raw = body.get("job_url") if isinstance(body, dict) else None
    if not isinstance(raw, str) or not raw:
        raise ProtocolError("a 202 answer without a job_url")
    url = base.join(raw)
    if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
        raise ProtocolError(f"the job URL {raw!r} points away from the worker")
    return url


def _answer(response: httpx.Response, base: httpx.URL) -> bytes | httpx.URL:
    """The bundle of a 200, the job URL of a 202; anything else raises."""
    if response.status_code == 200:
        return _bundle_of(response)
    if response.status_code == 202:
        return _job_url(response, base)
    raise _failure(response.status_code, _detail(response))


def _poll_answer(response: httpx.Response) -> bytes | None:
    """A job poll's bundle; None while the job is pending; a failed job raises."""
    if response.status_code != 200:
        raise _failure(response.status_code, _detail(response))
    if not response.headers.get("content-type", "").startswith("application/json"):
        return _bundle_of(response)
    body = response.json()
    state = body.get("state") if isinstance(body, dict) else None
    if state in _PENDING_STATES:
        return None
    if state == "failed":
        status = body.get("status_code")
        raise _failure(status if isinstance(status, int) else 502, _detail(response))
    raise ProtocolError(f"a job poll answered state {state!r} without a bundle")


def _poll_delays(deadline: float) -> Iterator[float]:
    """Seconds to wait before each job poll (quick at first, then 1 s) until *deadline*."""
    delay = 0.05
    while time.monotonic() + delay <= deadline:
        yield delay
        delay = min(delay * 2, 1.0)


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """httpx's exceptions as this module's: the one place they are translated."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise CellTimeout(None, f"{what}: no answer from the worker in time") from exc
    except httpx.HTTPError as exc:
        raise WorkerUnreachable(f"{what}: {exc}") from exc


def _past_deadline() -> CellTimeout:
    return CellTimeout(None, "no result by the client's deadline; the cell was cancelled")


# ---- the two clients -----------------------------------------------------------------


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
        self.base_url = _base_url(url)
        self.timeout_seconds = timeout_seconds
        self.queue_timeout_seconds = queue_timeout_seconds
        self.on_progress = on_progress
        self._headers = _headers(token)
        self._connect()

    def _busy(self, watch: ConsoleWatch, response: httpx.Response, wait: float) -> None:
        """Say that the worker is busy and when the cell is sent again."""
        detail = _detail(response)
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
    ) -> _Request:
        return _request(
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
        with _translated("GET /health"):
            return _health(self._http.get("health", timeout=10.0))

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
                self._http.post(_cancel_path(request), timeout=_CANCEL_TIMEOUT_SECONDS)
            raise
        return parse_bundle(body, time.perf_counter() - started)

    def _exchange(self, request: _Request) -> bytes:
        watch = ConsoleWatch(request.build_id)
        with self._watching(watch):
            answer = _answer(self._post(request, watch), self.base_url)
            if isinstance(answer, bytes):
                return answer
            for delay in _poll_delays(request.deadline):
                time.sleep(delay)  # the protocol's job polling: the worker cannot push
                with _translated("polling the job"):
                    bundle = _poll_answer(self._http.get(answer, timeout=30.0))
                if bundle is not None:
                    return bundle
        raise _past_deadline()

    def _post(self, request: _Request, watch: ConsoleWatch) -> httpx.Response:
        """POST the cell; a busy worker's 503 is waited out (bounded) and sent again."""
        while True:
            with _translated("POST /v1/execute"):
                response = self._http.post(
                    _EXECUTE_PATH[1:], files=request.files, timeout=request.http_timeout_seconds
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
        with _translated("GET /health"):
            return _health(await self._http.get("health", timeout=10.0))

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

    async def _exchange(self, request: _Request) -> bytes:
        watch = ConsoleWatch(request.build_id)
        async with self._watching(watch):
            answer = _answer(await self._post(request, watch), self.base_url)
            if isinstance(answer, bytes):
                return answer
            for delay in _poll_delays(request.deadline):
                await asyncio.sleep(delay)  # the protocol's job polling: the worker cannot push
                with _translated("polling the job"):
                    bundle = _poll_answer(await self._http.get(answer, timeout=30.0))
                if bundle is not None:
                    return bundle
        raise _past_deadline()

    async def _post(self, request: _Request, watch: ConsoleWatch) -> httpx.Response:
        """As :meth:`Client._post`."""
        while True:
            with _translated("POST /v1/execute"):
                response = await self._http.post(
                    _EXECUTE_PATH[1:], files=request.files, timeout=request.http_timeout_seconds
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

    async def _cancel(self, request: _Request) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self._http.post(_cancel_path(request), timeout=_CANCEL_TIMEOUT_SECONDS)


def _cancel_path(request: _Request) -> str:
    return f"v1/executions/{request.build_id}/cancel"


def _health(response: httpx.Response) -> dict[str, object]:
    if response.status_code not in (200, 503):
        raise RequestFailed(response.status_code, _detail(response))
    try:
        body = response.json()
    except ValueError as exc:
        raise ProtocolError("/health did not answer JSON") from exc
    if not isinstance(body, dict):
        raise ProtocolError("/health did not answer a JSON object")
    return body
