"""The protocol's routes: the push and pull execute endpoints, job polls, cancel and the
mount-cache probe. The probes and metrics are in :mod:`.health`."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager as ContextManager
from typing import TYPE_CHECKING, TypeVar

from fastapi import APIRouter, Depends, Request
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response

from ..errors import (
    BadRequest,
    BodyStalled,
    NotFound,
    Unprocessable,
    error_response,
    status_for,
    storage_checked,
)
from ..jobs import Job
from ..mounts.probe import cached_bytes
from ..protocol.envelopes import CellRequest, parse_execute_v1, parse_notebook_execute
from ..protocol.names import BUNDLE_HEADERS
from ..protocol.streaming import BundleStream, BundleStreamResponse, watching_for_disconnect
from ..pull.manifest import BuildManifest, read_manifest, submit_manifest
from ..pull.transfers import declared_length
from ..runs.directory import SMALL_IO_BYTES, RunDir, offload
from ..runs.reuse import MIN_FILE_BYTES, keep_and_remove
from ..service import submit
from ..tracing import Span, trace_context
from .auth import check_bearer
from .fleet import Fleet
from .heartbeat import HeartbeatResponse, ended_within
from .openapi import EXECUTE_RESPONSES, MANIFEST_BODY, multipart_body
from .peers import plain_segment
from .staging import bind_inputs, stage_multipart

if TYPE_CHECKING:
    from ..state import WorkerState

log = logging.getLogger(__name__)
T = TypeVar("T")


def _state(request: Request) -> WorkerState:
    state: WorkerState = request.app.state.worker
    return state


async def require_token(request: Request) -> None:
    """The bearer-token gate; runs before any body is read."""
    check_bearer(request.headers.get("authorization"), _state(request).settings.token)


router = APIRouter()
protected = APIRouter(dependencies=[Depends(require_token)])


@protected.post(
    "/v1/execute",
    responses=EXECUTE_RESPONSES,
    openapi_extra=multipart_body("executor-v1 (transform.ref notebook_cell@v1)"),
)
async def execute_v1(request: Request) -> Response:
    """Push model, executor-v1 envelope (the route the Strata client calls)."""
    return await _execute(request, parse_execute_v1)


@protected.post(
    "/v1/notebook-execute",
    responses=EXECUTE_RESPONSES,
    openapi_extra=multipart_body("flat notebook-cell-v1"),
)
async def notebook_execute(request: Request) -> Response:
    """Push model, the flat legacy envelope."""
    return await _execute(request, parse_notebook_execute)


async def _execute(request: Request, parse: Callable[[bytes], CellRequest]) -> Response:
    state = _state(request)
    carrier = trace_context(request.headers)
    with state.tracing.request(carrier, _route(request)) as span:
        with state.receiving_upload():  # held until the body is in (or refused and removed)
            with storage_checked("a new run directory"):
                run_root = state.settings.run_root
                run_dir = await offload(state.context.inline_io, RunDir.make, run_root)
            root = run_dir.root
            try:
                with storage_checked("this request's inputs"), state.tracing.step("worker.inputs"):
                    receiving = _receive(request, parse, run_dir, state)
                    cell = await _unless_stalled(receiving, run_dir, state)
                span.set("build_id", cell.build_id)
                job = submit(state, cell, run_dir)
            except BaseException:
                await asyncio.to_thread(shutil.rmtree, root, True)
                raise
        return _answered(span, await answer(request, state, job))


def _route(request: Request) -> dict[str, str]:
    return {"http.request.method": request.method, "http.route": request.url.path}


def _answered(span: Span, response: Response) -> Response:
    span.set("http.response.status_code", response.status_code)
    return response


async def answer(request: Request, state: WorkerState, job: Job) -> Response:
    """Wait briefly for a kernel: then answer inline, or 202 with the job's URL."""
    with state.jobs.awaited(job):  # cancelled first: the job goes, with its run directory
        async with watching_for_disconnect(request.receive, job.execution.cancel.set):
            try:
                await asyncio.wait_for(job.started.wait(), state.settings.queue_wait_seconds)
            except TimeoutError:
                return _accepted(state, job)
            await job.done.wait()
    return _deliver(state, job)


def _accepted(state: WorkerState, job: Job) -> JSONResponse:
    """Still queued after the short wait: hand the client a job URL to poll."""
    state.jobs.hand_off(job)
    state.metrics.accepted.inc()
    state.tracing.annotate({"worker.job.accepted": True, "worker.job.id": job.job_id})
    body: dict[str, object] = {"job_url": f"/v1/jobs/{job.job_id}", "state": job.state.value}
    position = state.jobs.position(job)
    if position is not None:
        body["position"] = position
    return JSONResponse(body, status_code=202)


def _deliver(state: WorkerState, job: Job, *, polled: bool = False) -> Response:
    """A finished job's answer, given once: its bundle, or its failure.

    The job leaves the registry now (a second poll finds nothing); its run directory is
    removed after the answer has been sent.
    """
    if not state.jobs.claim(job):
        raise NotFound("Unknown or expired job")
    result = job.result
    # a run whose bundle fit in memory left only small files: removing them inline is cheaper
    small = (
        state.context.inline_io
        and isinstance(result, bytes)
        and job.run_dir.received_bytes <= SMALL_IO_BYTES
    )
    # a run with large files (inputs, or outputs too big for an in-memory bundle) leaves
    # them for later inputs to be written over (see file_reuse)
    large = job.run_dir.received_bytes >= MIN_FILE_BYTES or not isinstance(result, bytes)
    files = state.reusable_files if large else None
    cleanup = BackgroundTask(offload, small, keep_and_remove, job.run_dir.root, files)
    if isinstance(result, bytes):
        return Response(
            result, media_type="application/x-tar", headers=BUNDLE_HEADERS, background=cleanup
        )
    if isinstance(result, BundleStream):
        return BundleStreamResponse(result, BUNDLE_HEADERS, cleanup)
    if isinstance(result, dict):  # a pull run's answer
        if polled:
            body = {"state": "finished", "status_code": 200, "result": result}
            return JSONResponse(body, background=cleanup)
        return JSONResponse(result, background=cleanup)
    assert job.error is not None
    timeout_status = state.settings.timeout_status
    if not polled:
        response = error_response(job.error, timeout_status=timeout_status)
        response.background = cleanup
        return response
    # the job protocol reports a failure as data: the client turns it into that status
    status = status_for(job.error, timeout_status=timeout_status)
    detail = job.error.detail
    body = {"state": "failed", "status_code": status, "error": detail, "detail": detail}
    return JSONResponse(body, background=cleanup)


@protected.get("/v1/jobs/{job_id}")
async def poll_job(job_id: str, request: Request) -> Response:
    """A queued or running job's state; once it ended, its bundle (or failure), once."""
    if not plain_segment(job_id):  # no job has such an id; a peer would read another path
        raise NotFound("Unknown job: a job id is a single plain path segment, never . or ..")
    state = _state(request)
    job = state.jobs.get(job_id)
    if job is None:
        fleet: Fleet = request.app.state.fleet
        if fleet.forwards(request) and not state.jobs.is_own(job_id):
            return await fleet.forward_poll(request, job_id)  # another worker's (see .fleet)
        raise NotFound("Unknown or expired job")
    job.polled_at = time.monotonic()  # someone is still after it (a drain waits for them)
    if job.done.is_set():
        return _deliver(state, job, polled=True)
    body: dict[str, object] = {"state": job.state.value}
    if job.execution.phase is not None:  # e.g. building its locked environment
        body["phase"] = job.execution.phase
        body["detail"] = job.execution.phase  # what Strata's client shows of a queued job
    position = state.jobs.position(job)
    if position is not None:
        body["position"] = position
    return JSONResponse(body)


async def _receive(
    request: Request,
    parse: Callable[[bytes], CellRequest],
    run_dir: RunDir,
    state: WorkerState,
) -> CellRequest:
    staged = await stage_multipart(
        _counted(_body(request), state, run_dir),
        request.headers.get("content-type", ""),
        run_dir.inputs,
        max_part_bytes=state.settings.max_input_bytes,
        direct=state.context.inline_io,
        reuse=state.reusable_files,
        body_bytes=declared_length(request.headers),
    )
    cell = parse(staged.metadata)
    # renames only: a thread is worth it on a disk, or for many of them
    inline = state.context.inline_io and len(staged.parts) <= 4
    await offload(inline, bind_inputs, cell, staged, run_dir.inputs)
    return cell


async def _body(request: Request) -> AsyncIterator[bytes]:
    """The request's body; a client gone before its end is a plain refusal, not a bug."""
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect:
        raise BadRequest("The client disconnected before its request body was complete") from None


async def _counted(
    chunks: AsyncIterator[bytes], state: WorkerState, run_dir: RunDir
) -> AsyncIterator[bytes]:
    clock = asyncio.get_running_loop().time
    run_dir.waiting_since = clock()
    async for chunk in chunks:  # waiting on the client: the body timeout's clock runs
        state.metrics.bytes_in.inc(len(chunk))
        run_dir.received_bytes += len(chunk)
        run_dir.waiting_since = None  # staging the chunk (a slow disk) is not the client's
        yield chunk
        run_dir.waiting_since = clock()
    run_dir.waiting_since = None  # the whole body is in


async def _unless_stalled(receiving: Awaitable[T], run_dir: RunDir, state: WorkerState) -> T:
    """``receiving``, or :class:`BodyStalled` once the body sends nothing for too long.

    A timer looks now and then at how long the worker has been waiting for the client's
    next bytes (a chunk only stamps a time: a wait per chunk would cost the upload path)
    and cancels this task when it is too long; the cancellation is taken back and answered
    408 unless the task was cancelled otherwise. Time spent staging (a slow disk) and after
    the body is in never counts.
    """
    loop = asyncio.get_running_loop()
    limit = state.settings.body_timeout_seconds
    task = asyncio.current_task()
    assert task is not None
    stalled = False
    handle: asyncio.TimerHandle | None = None

    def look() -> None:
        nonlocal handle, stalled
        since = run_dir.waiting_since
        idle = 0.0 if since is None else loop.time() - since
        if idle >= limit:
            stalled = True
            task.cancel()
        else:
            handle = loop.call_later(limit - idle, look)

    handle = loop.call_later(limit, look)
    try:
        return await receiving
    except asyncio.CancelledError:
        if stalled and task.uncancel() == 0:
            raise BodyStalled(
                f"The request body sent nothing for {limit:g}s; what it had sent was discarded"
            ) from None
        raise
    finally:
        if handle is not None:
            handle.cancel()


@protected.post("/v1/mount-cache/cached")
async def mount_cache_probe(request: Request) -> JSONResponse:
    """How much of each given mount listing this machine's read-only cache already holds."""
    try:
        body = await request.json()
    except (ValueError, RecursionError):  # not JSON, or nested too deep
        raise Unprocessable("Mount cache probe body must be JSON") from None
    if not isinstance(body, dict):
        raise Unprocessable("Mount cache probe body must be an object")
    try:
        cached = await cached_bytes(body, _state(request).mount_cache)
    except BadRequest as exc:  # the reference validates this body as a model: 422
        raise Unprocessable(exc.detail) from None
    return JSONResponse({"cached_bytes": cached})


@protected.post("/v1/executions/{build_id}/cancel")
async def cancel_execution(build_id: str, request: Request) -> JSONResponse:
    """Stop an in-flight execution of ``build_id``; its kernel is retired. One that runs
    nowhere here may run on a peer: they are asked too (see .fleet)."""
    if not plain_segment(build_id):  # a peer would read another path
        raise BadRequest("A build id is a single plain path segment, never . or ..")
    cancelled = _state(request).cancel(build_id)
    fleet: Fleet = request.app.state.fleet
    if not cancelled and fleet.forwards(request):
        cancelled = await fleet.forward_cancel(request, build_id)
    return JSONResponse({"build_id": build_id, "cancelled": cancelled})


@protected.post(
    "/v1/execute-manifest",
    responses={
        200: {"description": "Uploaded and finalized: success, build_id, byte_size, finalize"},
        **{k: v for k, v in EXECUTE_RESPONSES.items() if k != 200},
    },
    openapi_extra=MANIFEST_BODY,
)
async def execute_manifest(request: Request) -> Response:
    """Pull model: inputs from signed URLs, the bundle to the store, then finalize."""
    state = _state(request)
    manifest = await read_manifest(state, _body(request))
    with _traced(request, state, manifest) as span:
        return _answered(span, await answer(request, state, await submit_manifest(state, manifest)))


def _traced(request: Request, state: WorkerState, manifest: BuildManifest) -> ContextManager[Span]:
    """A manifest's ``worker.execute`` span: its trace context from the headers, else the
    manifest's own."""
    carrier = trace_context(request.headers, manifest.trace_metadata)
    return state.tracing.request(carrier, {**_route(request), **manifest.trace_attributes})


@protected.post("/execute", openapi_extra=MANIFEST_BODY)
async def execute_pool_alias(request: Request) -> Response:
    """strata-pool's path to the pull model (it posts the manifest with no content type);
    with ``--heartbeat-seconds``, a long run's answer streams (see :mod:`.heartbeat`)."""
    state = _state(request)
    interval = state.settings.heartbeat_seconds
    if interval is None:
        return await execute_manifest(request)
    manifest = await read_manifest(state, _body(request))
    with _traced(request, state, manifest) as span:
        job = await submit_manifest(state, manifest)
        with state.jobs.awaited(job):
            async with watching_for_disconnect(request.receive, job.execution.cancel.set):
                ended = await ended_within(job, interval)
        if ended:
            return _answered(span, _deliver(state, job))
        timeout_status = state.settings.timeout_status
        return HeartbeatResponse(job, interval, lambda: _deliver(state, job), timeout_status)


router.include_router(protected)
