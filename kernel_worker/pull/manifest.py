"""The pull model: ``POST /v1/execute-manifest`` (and strata-pool's ``POST /execute``).

The orchestrator sends a build manifest of signed URLs instead of the data (spec §3.4):
the worker downloads each input into the run directory, runs the cell as the push routes
do, uploads the bundle to ``output.url`` and POSTs to ``finalize_url``. A cell exception
is data here too: its bundle (``success: false``) is uploaded and finalized like any
other. A timeout (408) uploads and finalizes nothing.

Validation follows the reference's order and wording. Every URL passes
:class:`~kernel_worker.pull.url_safety.UrlGuard` while the manifest is read, and every
connection made for the request is pinned to the addresses that check passed;
``output.headers`` pass :mod:`~kernel_worker.pull.headers` (nothing that frames or
routes a request).
``params`` is the flat (notebook-execute) envelope with ``input_specs`` for ``inputs``,
so it is parsed by :func:`~kernel_worker.protocol.envelopes.parse_notebook_execute`: one set of
rules for source, timeout, env, mounts, formats and file names, whichever route.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import httpx

from ..errors import BadRequest, Cancelled, PayloadTooLarge, WorkerBusy, storage_checked
from ..jobs import Job, JobResult
from ..protocol.bundle import CellOutcome
from ..protocol.envelopes import CellRequest, parse_notebook_execute
from ..runs import output_dirs
from ..runs.directory import RunDir
from ..service import CANCELLED_DETAIL, execute_to_bundle_file, submit_work
from ..tracing import TRACE_CONTEXT_KEYS
from .headers import upload_headers
from .output_stream import OutputDirStreamer, streaming, without_streamed
from .transfers import UploadTarget, console_relay, deliver_bundle, download
from .url_safety import UrlGuard, UrlPolicy, pinned

if TYPE_CHECKING:
    from ..jobs import Execution
    from ..state import WorkerState

__all__ = [
    "MANIFEST_PROTOCOL",
    "BuildManifest",
    "parse_manifest",
    "read_body",
    "read_manifest",
    "submit_manifest",
]

MANIFEST_PROTOCOL = "notebook-build-manifest@v1"
EXECUTOR_REF = "notebook_cell@v1"
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MIN_TRANSFER_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Download:
    """One input to fetch: its ``strata://`` URI, signed URL and staged file name."""

    uri: str
    url: str
    file: str


@dataclass(frozen=True, slots=True)
class BuildManifest:
    """A validated manifest: the cell, where its inputs come from, where the bundle goes."""

    build_id: object  # echoed back as sent
    cell: CellRequest
    downloads: tuple[Download, ...]
    output: UploadTarget
    finalize_url: str
    log_url: str | None
    output_file_url: str | None  # checked; ``# @output_dir`` files are streamed there
    pins: Mapping[str, tuple[str, ...]]
    trace_metadata: Mapping[str, object] = field(default_factory=dict)
    """The metadata's trace context (``traceparent``, ``tracestate``), if it sent one."""
    trace_attributes: Mapping[str, str | None] = field(default_factory=dict)
    """The ids a trace of the run carries: ``build_id``, ``notebook_id``, ``cell_id``."""


async def read_manifest(state: WorkerState, body: AsyncIterator[bytes]) -> BuildManifest:
    """The request's manifest, read and validated (see :func:`parse_manifest`)."""
    policy = UrlPolicy(state.settings.allow_local_hosts, state.settings.allowed_hosts)
    return await parse_manifest(await read_body(body), UrlGuard(policy))


async def submit_manifest(state: WorkerState, manifest: BuildManifest) -> Job:
    """Admit a validated manifest's run as a job whose result is the 200 answer."""
    client = state.http_client
    if client is None:
        raise WorkerBusy("Worker is not serving yet")
    with storage_checked("a new run directory"):
        run_dir = await asyncio.to_thread(RunDir.make, state.settings.run_root)

    async def work(execution: Execution, job: Job) -> JobResult:
        with pinned(manifest.pins):
            return await _build(state, client, manifest, run_dir, execution, job)

    try:
        return submit_work(state, manifest.cell.build_id, run_dir, work)
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, run_dir.root, True)
        raise


async def _build(
    state: WorkerState,
    client: httpx.AsyncClient,
    manifest: BuildManifest,
    run_dir: RunDir,
    execution: Execution,
    job: Job,
) -> dict[str, object]:
    transfer_seconds = max(manifest.cell.timeout_seconds, MIN_TRANSFER_SECONDS)
    # fetching inputs is not waiting for a kernel: a poller sees "provisioning", and the
    # run takes no place in the queue until it does wait
    job.mark_provisioning(bool(manifest.downloads))
    with state.tracing.step("worker.inputs") as span:
        span.set("worker.inputs.count", len(manifest.downloads))
        for item in manifest.downloads:
            if execution.cancel.is_set():
                raise Cancelled(CANCELLED_DETAIL)
            with storage_checked("this request's inputs"):
                await download(
                    client, item.url, run_dir.inputs / item.file, uri=item.uri,
                    cap=state.settings.max_input_bytes, timeout_seconds=transfer_seconds,
                    reuse=state.reusable_files,
                )  # fmt: skip
    job.mark_provisioning(False)
    max_files = state.context.limits.output_dir_files
    streamer = _streamer(client, manifest, run_dir, transfer_seconds, max_files)

    async def after_cell(outcome: CellOutcome) -> CellOutcome:
        if streamer is None:
            return outcome
        await streamer.send(settled_only=False)  # the final pass
        streamed = await asyncio.to_thread(streamer.streamed)
        listing = without_streamed(outcome.output_dirs, streamed)
        return replace(outcome, output_dirs=listing, output_dirs_streamed=streamed)

    poll = state.settings.output_dir_poll_seconds
    async with console_relay(client, manifest.log_url) as console, streaming(streamer, poll):
        bundle = await execute_to_bundle_file(
            state,
            manifest.cell,
            run_dir,
            execution,
            console=console,
            after_cell=after_cell,
            on_start=job.mark_running,
        )
    size = (await asyncio.to_thread(bundle.stat)).st_size
    execution.stoppable = False  # the cell is over; its bundle is delivered whatever comes
    with state.tracing.step("worker.upload") as span:
        span.set("worker.bundle.bytes", size)
        finalized = await deliver_bundle(
            client, manifest.output, manifest.finalize_url, bundle, timeout_seconds=transfer_seconds
        )
    return {
        "success": True,
        "build_id": manifest.build_id,
        "byte_size": size,
        "protocol_version": MANIFEST_PROTOCOL,
        "finalize": finalized,
    }


def _streamer(
    client: httpx.AsyncClient,
    manifest: BuildManifest,
    run_dir: RunDir,
    timeout_seconds: float,
    max_files: int,
) -> OutputDirStreamer | None:
    """A streamer when the orchestrator takes output files and the cell declares folders."""
    names = output_dirs.declared(manifest.cell.source)
    if manifest.output_file_url is None or not names:
        return None
    return OutputDirStreamer(
        client,
        manifest.output_file_url,
        run_dir.root,
        names,
        timeout_seconds=timeout_seconds,
        max_files=max_files,
    )


async def read_body(chunks: AsyncIterator[bytes]) -> bytes:
    """The request body, refused (413) past :data:`MAX_MANIFEST_BYTES`."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > MAX_MANIFEST_BYTES:
            raise PayloadTooLarge(f"Manifest payload exceeds {MAX_MANIFEST_BYTES}-byte cap")
        parts.append(chunk)
    return b"".join(parts)


# ---- the manifest ---------------------------------------------------------------------


async def parse_manifest(body: bytes, guard: UrlGuard) -> BuildManifest:
    """Validate *body* in the reference's order (spec §3.4 step 1, then steps 2-4).

    Raises:
        BadRequest: With the reference's detail for each malformed or refused part.
    """
    document = _document(body)
    metadata = document.get("metadata", {})
    if not isinstance(metadata, dict):
        raise BadRequest("Manifest metadata must be an object")
    executor_ref = _text(metadata.get("executor_ref"))
    if executor_ref != EXECUTOR_REF:
        raise BadRequest(f"Unsupported executor ref: {executor_ref}. Expected: {EXECUTOR_REF}")
    params = metadata.get("params", {})
    if not isinstance(params, dict):
        raise BadRequest("Manifest params must be an object")
    signed = await _signed_inputs(document.get("inputs", []), guard)
    output = _output(document.get("output", {}))
    finalize_url = _text(document.get("finalize_url"))
    if not output.url or not finalize_url:
        raise BadRequest("Manifest is missing upload/finalize URLs")
    await guard.check(output.url, "Manifest output.url")
    await guard.check(finalize_url, "Manifest finalize_url")
    log_url = await _optional_url(document, "log_url", guard)
    output_file_url = await _optional_url(document, "output_file_url", guard)
    cell = _cell(params, metadata.get("build_id"))
    ids = {key: _text(metadata.get(key)) or None for key in ("notebook_id", "cell_id")}
    return BuildManifest(
        build_id=document.get("build_id"),
        cell=cell,
        downloads=tuple(_downloads(cell, params.get("input_specs") or {}, signed)),
        output=output,
        finalize_url=finalize_url,
        log_url=log_url,
        output_file_url=output_file_url,
        pins=guard.pins,
        trace_metadata={k: metadata[k] for k in TRACE_CONTEXT_KEYS if k in metadata},
        trace_attributes={"build_id": cell.build_id, **ids},
    )


def _document(body: bytes) -> dict[str, object]:
    try:
        document = json.loads(body)
    # JSONDecodeError and UnicodeDecodeError alike; RecursionError: nested too deep
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"Invalid manifest payload: {exc}") from None
    if not isinstance(document, dict):
        raise BadRequest("Manifest payload must be an object")
    return document


async def _signed_inputs(entries: object, guard: UrlGuard) -> dict[str, str]:
    """``inputs[]`` as ``strata://artifact/<id>@v=<version>`` → signed URL, each URL checked."""
    if not isinstance(entries, list):
        raise BadRequest("Manifest inputs must be a list")
    signed: dict[str, str] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise BadRequest("Manifest input entry must be an object")
        artifact_id = _text(entry.get("artifact_id"))
        version = entry.get("version")
        url = _text(entry.get("url"))
        if not artifact_id or not url or not isinstance(version, int) or isinstance(version, bool):
            raise BadRequest("Manifest input entry is incomplete")
        await guard.check(url, f"Manifest input[{artifact_id}@v={version}]")
        signed[f"strata://artifact/{artifact_id}@v={version}"] = url
    return signed


def _output(output: object) -> UploadTarget:
    if not isinstance(output, dict):
        raise BadRequest("Manifest output must be an object")
    fields = output.get("fields")
    headers = output.get("headers") or {}
    if not isinstance(headers, dict):
        raise BadRequest("Manifest output headers must be an object")
    return UploadTarget(
        url=_text(output.get("url")),
        method=_text(output.get("method")),
        fields={str(k): str(v) for k, v in fields.items()} if isinstance(fields, dict) else None,
        headers=upload_headers(headers),
    )


async def _optional_url(document: dict[str, object], key: str, guard: UrlGuard) -> str | None:
    url = _text(document.get(key)) or None
    if url is not None:
        await guard.check(url, f"Manifest {key}")
    return url


def _cell(params: dict[str, object], build_id: object) -> CellRequest:
    """``params`` through the flat envelope's parser (``input_specs`` are its ``inputs``)."""
    envelope = {
        **params,
        "protocol_version": "notebook-cell-v1",
        "inputs": params.get("input_specs", {}),
        "build_id": build_id,
    }
    return parse_notebook_execute(json.dumps(envelope).encode("utf-8"))


def _downloads(
    cell: CellRequest, raw_specs: object, signed: Mapping[str, str]
) -> Iterator[Download]:
    """Each input (and injected value) with its signed URL, all found before any fetch."""
    assert isinstance(raw_specs, dict)  # the envelope parser refused anything else
    for spec in cell.inputs:
        raw = raw_specs[spec.name]
        yield _download(spec.name, raw, spec.file, signed)
        injected = raw.get("injected") or {}
        for sub in spec.injected:
            yield _download(sub.name, injected[sub.name], sub.file, signed)


def _download(var: str, raw: dict[str, object], file: str, signed: Mapping[str, str]) -> Download:
    uri = _text(raw.get("uri"))
    if not uri:
        raise BadRequest(f"Manifest input spec for {var} is missing uri")
    url = signed.get(uri)
    if url is None:
        raise BadRequest(f"Manifest does not include a signed URL for {uri}")
    return Download(uri=uri, url=url, file=file)


def _text(value: object) -> str:
    """A manifest string as the reference reads it: ``str(value).strip()``, null as empty."""
    return "" if value is None else str(value).strip()
