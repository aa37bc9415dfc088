"""The pull model's transfers: inputs in, the bundle out, finalize, and the live console.

Everything streams: an input goes to disk in bounded batches as it arrives, the bundle
is read from disk in chunks as it is sent (multipart framing included), and no response
body is read past a small cap. Memory stays flat whatever the sizes. Every transfer goes
through the worker's one guarded client (:func:`kernel_worker.pull.url_safety.guarded_client`),
which follows no redirect: a 3xx is an upstream failure like any other unexpected status.

The details of failures are the reference's (spec §3.4 steps 4, 6 and 7); transport errors
are translated here and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import httpx

from ..cancellation import cancel_and_wait
from ..errors import PayloadTooLarge, UpstreamFailed, WorkerError
from ..execution import ConsoleListener
from ..protocol.streaming import CHUNK_BYTES  # bundle reads; input writes are batched to about this
from ..runs import files as run_files
from ..runs.reuse import ReusableFiles, new_file

__all__ = [
    "UploadTarget",
    "console_relay",
    "deliver_bundle",
    "download",
]

log = logging.getLogger(__name__)

OUTPUT_FORMAT = "notebook-output-bundle@v1"
ACCEPTED_UPLOAD_STATUSES = frozenset({200, 201, 204})
DETAIL_BYTES = 64 * 1024  # of an error response, quoted in a detail
FINALIZE_BYTES = 8 * 1024 * 1024  # of the finalize answer, returned to the caller
LOG_QUEUE_CHUNKS = 64
LOG_POST_SECONDS = 5.0
LOG_DRAIN_SECONDS = 10.0
REDIRECT_REFUSED = "redirects are not followed"


@dataclass(frozen=True, slots=True)
class UploadTarget:
    """Where the bundle goes: ``fields`` → presigned multipart POST, else PUT or raw POST.

    ``headers`` (sent with a PUT) are checked by :mod:`~kernel_worker.pull.headers`:
    none frames or routes the request, which ``_send`` frames itself."""

    url: str
    method: str
    fields: Mapping[str, str] | None
    headers: Mapping[str, str]


# ---- inputs ---------------------------------------------------------------------------


async def download(
    client: httpx.AsyncClient,
    url: str,
    target: Path,
    *,
    uri: str,
    cap: int,
    timeout_seconds: float,
    reuse: ReusableFiles | None = None,
) -> int:
    """Stream *url* into *target* (over a kept file of ``reuse`` when one fits its declared
    length: see file_reuse); return its size.

    Raises:
        UpstreamFailed: Not a 200 (a redirect included), or the transfer failed.
        PayloadTooLarge: Declared or received bytes beyond *cap*.
    """
    try:
        async with client.stream("GET", url, timeout=timeout_seconds) as response:
            if response.status_code != 200:
                suffix = f" ({REDIRECT_REFUSED})" if response.is_redirect else ""
                raise UpstreamFailed(
                    f"Failed to download notebook input {uri}: {response.status_code}{suffix}"
                )
            declared = declared_length(response.headers)
            if declared is not None and declared > cap:
                raise PayloadTooLarge(
                    f"Notebook input {uri} declared {declared} bytes, exceeds {cap}-byte cap"
                )
            return await _save(response, target, uri, cap, reuse, declared)
    except httpx.TimeoutException as exc:
        raise UpstreamFailed(f"Timed out downloading notebook input {uri}: {_why(exc)}") from None
    except httpx.HTTPError as exc:
        raise UpstreamFailed(f"Failed to download notebook input {uri}: {_why(exc)}") from None


def declared_length(headers: Mapping[str, str]) -> int | None:
    """A message's ``Content-Length``, or None when it has none (or not a number)."""
    try:
        return int(headers["content-length"])
    except (KeyError, ValueError):
        return None


async def _save(
    response: httpx.Response,
    target: Path,
    uri: str,
    cap: int,
    reuse: ReusableFiles | None,
    declared: int | None,
) -> int:
    """Write the body as it arrives, batched so each thread hop writes about a megabyte."""
    out = await asyncio.to_thread(new_file, target, reuse, declared)
    try:
        received = 0
        batch: list[bytes] = []
        batched = 0
        async for chunk in response.aiter_bytes():
            received += len(chunk)
            if received > cap:
                raise PayloadTooLarge(
                    f"Notebook input {uri} exceeds {cap}-byte cap during download"
                )
            batch.append(chunk)
            batched += len(chunk)
            if batched >= CHUNK_BYTES:
                await asyncio.to_thread(out.writelines, batch)
                batch, batched = [], 0
        await asyncio.to_thread(out.writelines, batch)
        await asyncio.to_thread(out.truncate)  # a kept file written over may be longer
    finally:
        await asyncio.to_thread(out.close)
    return received


# ---- the bundle -----------------------------------------------------------------------


async def deliver_bundle(
    client: httpx.AsyncClient,
    target: UploadTarget,
    finalize_url: str,
    bundle: Path,
    *,
    timeout_seconds: float,
) -> object:
    """Upload *bundle*, then finalize the build; return the finalize answer (JSON).

    Raises:
        UpstreamFailed: The store or the orchestrator refused, or a transfer failed.
    """
    try:
        await _upload(client, target, bundle, timeout_seconds)
        return await _finalize(client, finalize_url, timeout_seconds)
    except httpx.TimeoutException as exc:
        raise UpstreamFailed(f"Notebook bundle transfer timed out: {_why(exc)}") from None
    except httpx.HTTPError as exc:
        raise UpstreamFailed(f"Notebook bundle transfer failed: {_why(exc)}") from None


async def _upload(
    client: httpx.AsyncClient, target: UploadTarget, bundle: Path, timeout_seconds: float
) -> None:
    try:  # the run directory is the cell's to write in: no link is followed (see run_files)
        source = await asyncio.to_thread(run_files.open_regular, bundle.parent, [bundle.name])
    except OSError as exc:
        raise WorkerError(f"The run's bundle could not be read back: {exc}") from None
    with source:
        await _send(client, target, source, timeout_seconds)


async def _send(
    client: httpx.AsyncClient, target: UploadTarget, source: BinaryIO, timeout_seconds: float
) -> None:
    size = os.fstat(source.fileno()).st_size
    headers = httpx.Headers()
    method = "POST"
    if target.fields is not None:
        boundary = secrets.token_hex(16)
        head, tail = _multipart_frame(target.fields, boundary)
        body = _framed(head, _chunks(source), tail)
        headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
        headers["Content-Length"] = str(len(head) + size + len(tail))
    else:
        if target.method == "PUT":
            method = "PUT"
            headers.update(target.headers)
        body = _chunks(source)
        headers["Content-Type"] = "application/x-tar"
        headers["Content-Length"] = str(size)
    async with client.stream(
        method, target.url, content=body, headers=headers, timeout=timeout_seconds
    ) as response:
        if response.status_code not in ACCEPTED_UPLOAD_STATUSES:
            detail = await _detail(response)
            raise UpstreamFailed(
                f"Failed to upload notebook bundle output: {response.status_code} ({detail})"
            )


async def _finalize(client: httpx.AsyncClient, url: str, timeout_seconds: float) -> object:
    body = {"output_format": OUTPUT_FORMAT}
    async with client.stream("POST", url, json=body, timeout=timeout_seconds) as response:
        if response.status_code != 200:
            detail = await _detail(response)
            raise UpstreamFailed(
                f"Failed to finalize notebook bundle build: {response.status_code} ({detail})"
            )
        raw, complete = await _read_capped(response, FINALIZE_BYTES)
    if not complete:
        raise UpstreamFailed(
            f"Failed to finalize notebook bundle build: 200 (answer over {FINALIZE_BYTES} bytes)"
        )
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise UpstreamFailed(
            "Failed to finalize notebook bundle build: 200 (the answer is not JSON)"
        ) from None


def _multipart_frame(fields: Mapping[str, str], boundary: str) -> tuple[bytes, bytes]:
    """The bytes before and after the file part: the fields first, as S3's POST wants."""
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{_quoted(name)}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="bundle.tar"'
        "\r\nContent-Type: application/x-tar\r\n\r\n"
    )
    return "".join(parts).encode("utf-8"), f"\r\n--{boundary}--\r\n".encode("ascii")


def _quoted(name: str) -> str:
    """A form field name inside quotes, escaped as browsers (and httpx) do."""
    return name.replace("\r", "%0D").replace("\n", "%0A").replace('"', "%22")


async def _framed(head: bytes, chunks: AsyncIterator[bytes], tail: bytes) -> AsyncIterator[bytes]:
    yield head
    async for chunk in chunks:
        yield chunk
    yield tail


async def file_chunks(root: Path, parts: Sequence[str]) -> AsyncIterator[bytes]:
    """The regular file ``root/<parts…>`` (reached through no link) in chunks, each read in a
    thread."""
    source = await asyncio.to_thread(run_files.open_regular, root, parts)
    async for chunk in _chunks(source):
        yield chunk


async def _chunks(source: BinaryIO) -> AsyncIterator[bytes]:
    """An open file's bytes in chunks, each read in a thread; the file is closed after."""
    try:
        while chunk := await asyncio.to_thread(source.read, CHUNK_BYTES):
            yield chunk
    finally:
        await asyncio.to_thread(source.close)


async def _detail(response: httpx.Response) -> str:
    """An error answer's JSON ``detail`` or ``error``, else its text, else ``HTTP <status>``."""
    if response.is_redirect:
        return REDIRECT_REFUSED
    raw, _ = await _read_capped(response, DETAIL_BYTES)
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError):
        payload = None
    if isinstance(payload, dict):
        detail = payload.get("detail") or payload.get("error")
        if detail:
            return str(detail)
    text = raw.decode("utf-8", errors="replace").strip()
    return text or f"HTTP {response.status_code}"


async def _read_capped(response: httpx.Response, cap: int) -> tuple[bytes, bool]:
    """Up to *cap* bytes of the body, and whether that was all of it."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > cap:
            return b"".join(chunks)[:cap], False
    return b"".join(chunks), True


def _why(exc: httpx.HTTPError) -> str:
    return str(exc) or type(exc).__name__


# ---- the live console -----------------------------------------------------------------


@contextlib.asynccontextmanager
async def console_relay(
    client: httpx.AsyncClient, log_url: str | None
) -> AsyncIterator[ConsoleListener | None]:
    """Forward console chunks to *log_url* while the block runs (None: no listener).

    Best effort: the bundle stays the record. Chunks wait in a bounded queue drained by
    one task; a chunk that finds the queue full is dropped but still uses its ``seq``
    number, so a slow log server never slows the cell. On exit the queue is drained for
    at most :data:`LOG_DRAIN_SECONDS`, then the task is stopped.
    """
    if log_url is None:
        yield None
        return
    relay = _Relay(client, log_url)
    task = asyncio.ensure_future(relay.run())
    try:
        yield relay.offer
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(relay.queue.join(), LOG_DRAIN_SECONDS)
    finally:
        await cancel_and_wait(task)


class _Relay:
    def __init__(self, client: httpx.AsyncClient, log_url: str) -> None:
        self._client = client
        self._url = log_url + ("&" if "?" in log_url else "?")
        self._seq: dict[str, int] = {}
        self.queue: asyncio.Queue[tuple[str, int, str]] = asyncio.Queue(LOG_QUEUE_CHUNKS)

    def offer(self, stream: str, text: str) -> None:
        """The console listener: never blocks, never raises."""
        if not text:
            return
        seq = self._seq.get(stream, 0)
        self._seq[stream] = seq + 1
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait((stream, seq, text))

    async def run(self) -> None:
        while True:
            stream, seq, text = await self.queue.get()
            try:
                await self._post(stream, seq, text)
            finally:
                self.queue.task_done()

    async def _post(self, stream: str, seq: int, text: str) -> None:
        url = f"{self._url}stream={stream}&seq={seq}"
        try:
            async with self._client.stream(
                "POST", url, content=text.encode("utf-8"), timeout=LOG_POST_SECONDS
            ) as response:
                if not response.is_success:
                    log.debug(
                        "log server answered %d to %s chunk %d", response.status_code, stream, seq
                    )
        except httpx.HTTPError as exc:
            log.debug("could not forward %s chunk %d: %s", stream, seq, _why(exc))
