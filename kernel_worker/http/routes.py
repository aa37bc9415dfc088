"""HTTP routes: health and the push-model execute endpoints."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import APIRouter, Depends, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response

from .. import __version__
from ..errors import (
    BadRequest,
    BodyStalled,
    NotFound,
    Unprocessable,
    error_response,
    status_for,
    storage_checked,
)
from ..execution import SMALL_IO_BYTES, RunDir, offload
from ..jobs import Job
from ..mounts.probe import cached_bytes
from ..protocol.envelopes import CellRequest, parse_execute_v1, parse_notebook_execute
from ..protocol.streaming import BundleStream, BundleStreamResponse, watching_for_disconnect
from ..pull.manifest import submit_manifest
from ..pull.transfers import declared_length
from ..runs.reuse import MIN_FILE_BYTES, keep_and_remove
from ..service import submit
from .auth import check_bearer
from .heartbeat import HeartbeatResponse, ended_within
from .staging import bind_inputs, stage_multipart

if TYPE_CHECKING:
    from ..state import WorkerState

log = logging.getLogger(__name__)
T = TypeVar("T")

EXECUTOR_PROTOCOL = "v1"
NOTEBOOK_PROTOCOL = "notebook-cell-v1"
TRANSFORM_REF = "notebook_cell@v1"
OUTPUT_FORMAT = "notebook-output-bundle@v1"
BUNDLE_HEADERS = {
    "X-Strata-Executor-Protocol": EXECUTOR_PROTOCOL,
    "X-Strata-Notebook-Executor-Protocol": NOTEBOOK_PROTOCOL,
    "X-Strata-Output-Format": OUTPUT_FORMAT,
}


def _state(request: Request) -> WorkerState:
    state: WorkerState = request.app.state.worker
    return state


async def require_token(request: Request) -> None:
    """The bearer-token gate; runs before any body is read."""
    check_bearer(request.headers.get("authorization"), _state(request).settings.token)


router = APIRouter()
protected = APIRouter(dependencies=[Depends(require_token)])

OPENAPI_COMPONENTS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["detail"],
        "properties": {
            "detail": {"type": "string"},
            "success": {"type": "boolean"},
            "error": {"type": "string"},
        },
    },
    "JobAccepted": {
        "type": "object",
        "required": ["job_url", "state"],
        "properties": {
            "job_url": {"type": "string"},
            "state": {"type": "string", "enum": ["queued", "running"]},
            "position": {"type": "integer"},
        },
    },
}
_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_BUNDLE = {
    "description": "The output bundle (gzipped tar; a cell that raised has success: false)",
    "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}},
}
_ACCEPTED = {
    "description": "Every kernel is busy: poll job_url",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/JobAccepted"}}},
}
_EXECUTE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: _BUNDLE,
    202: _ACCEPTED,
    400: {"description": "Malformed envelope, descriptor, part or name", **_ERROR},
    401: {"description": "Token missing or wrong", **_ERROR},
    408: {"description": "The cell exceeded timeout_seconds (504 with --timeout-status 504)"},
    409: {"description": "Cancelled", **_ERROR},
    413: {"description": "An input exceeds STRATA_WORKER_MAX_INPUT_BYTES", **_ERROR},
    502: {"description": "The kernel died during the cell", **_ERROR},
    503: {"description": "The queue is full (Retry-After)", **_ERROR},
}


def _multipart_body(envelope: str) -> dict[str, Any]:
    """The OpenAPI request body of a push route: a metadata file part plus input parts."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["metadata"],
                        "properties": {
                            "metadata": {
                                "type": "string",
                                "format": "binary",
                                "description": f"A JSON file part: the {envelope} envelope",
                            }
                        },
                        "additionalProperties": {
                            "type": "string",
                            "format": "binary",
                            "description": "One file part per input, named by its file name "
                            "(e.g. df.arrow) or its variable name",
                        },
                    }
                }
            },
        }
    }


_MANIFEST_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["metadata", "inputs", "output", "finalize_url"],
                    "properties": {
                        "build_id": {"type": "string"},
                        "metadata": {"type": "object"},
                        "inputs": {"type": "array", "items": {"type": "object"}},
                        "output": {"type": "object"},
                        "finalize_url": {"type": "string"},
                        "log_url": {"type": "string"},
                        "output_file_url": {"type": "string"},
                    },
                }
            }
        },
    }
}


def _warm_kernels(kernels: Mapping[str, int]) -> int:
    return sum(kernels.get(state, 0) for state in ("idle", "busy", "resetting"))


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """Liveness and capabilities: 200 while the worker can take cells, that is while a kernel
    is warm or one is on its way (a replacement starting after a timeout, the pool warming
    up: cells wait for it). Strata's client refuses a cell that needs a feature when this
    is not 200, so it must not flicker while a kernel is replaced; ``/ready`` is the probe
    that wants a warm kernel. 503 only while draining, or with no kernel warm or starting
    (every start failing)."""
    state = _state(request)
    stats = state.pool.stats()
    kernels = stats.kernels_by_state
    serving = _warm_kernels(kernels) + kernels.get("starting", 0) > 0
    slots = state.settings.gpu_slots
    body: dict[str, Any] = {
        "status": "healthy" if serving else "unhealthy",
        "capabilities": {
            "protocol_versions": [EXECUTOR_PROTOCOL],
            "transform_refs": [TRANSFORM_REF],
            "features": _features(),
            "limits": {
                "max_input_bytes": state.settings.max_input_bytes,
                "console_cap": state.settings.console_cap,
                **state.context.limits.described(),
            },
        },
        "version": __version__,
        "uptime_seconds": round(time.monotonic() - state.started_at, 3),
        "launch_id": state.settings.launch_id,
        "active_executions": state.active_executions,
        "queue_depth": state.jobs.queued,
        "max_concurrent": state.settings.max_concurrent or state.settings.pool_size,
        "active_uploads": state.uploads,
        "max_uploads": state.settings.max_uploads,
        "gpu_slots": len(slots) if slots else None,
        "free_gpu_slots": _free_slots(state) if slots else None,
        "hardware": dict(state.context.hardware),
        "pool": {
            "size": stats.size,
            "spares": stats.spares,
            "kernels": dict(stats.kernels_by_state),
            "leases_served": stats.leases_served,
            "retirements": dict(stats.retirements),
            "start_failures": stats.start_failures,
            "recycle": state.settings.recycle.value,
            "memory": state.pool.memory().as_dict(),
        },
    }
    if state.draining:
        body["status"] = "draining"
    return JSONResponse(body, status_code=200 if serving and not state.draining else 503)


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    """Readiness (a load balancer's probe): 200 only while a warm kernel exists and the
    worker is not draining, so traffic waits for the pool's warm-up."""
    state = _state(request)
    kernels = dict(state.pool.stats().kernels_by_state)
    is_ready = _warm_kernels(kernels) > 0 and not state.draining
    body = {"ready": is_ready, "draining": state.draining, "kernels": kernels}
    return JSONResponse(body, status_code=200 if is_ready else 503)


# HEAD for load balancers and uptime checks: the same answer without a body (uvicorn drops
# it); kept out of the schema, where it would repeat the GET operations' ids
router.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)
router.add_api_route("/ready", ready, methods=["HEAD"], include_in_schema=False)


def _features() -> dict[str, object]:
    """Advertise only what this worker implements."""
    return {
        "notebook_protocol_version": NOTEBOOK_PROTOCOL,
        "output_format": OUTPUT_FORMAT,
        "pull_model": True,
        "cancel": True,
        "output_dirs": True,
        "folder_inputs": True,
        "locked_environments": False,
        "languages": ["python"],
        "locked_r_environments": False,
        "mount_cache_probe": True,
    }


def _free_slots(state: WorkerState) -> int:
    """Slots no lease holds; an id listed twice (two kernels sharing a GPU) counts twice."""
    busy = Counter(state.pool.stats().busy_slots)
    return sum((Counter(state.settings.gpu_slots) - busy).values())


@protected.post(
    "/v1/execute",
    responses=_EXECUTE_RESPONSES,
    openapi_extra=_multipart_body("executor-v1 (transform.ref notebook_cell@v1)"),
)
async def execute_v1(request: Request) -> Response:
    """Push model, executor-v1 envelope (the route the Strata client calls)."""
    return await _execute(request, parse_execute_v1)


@protected.post(
    "/v1/notebook-execute",
    responses=_EXECUTE_RESPONSES,
    openapi_extra=_multipart_body("flat notebook-cell-v1"),
)
async def notebook_execute(request: Request) -> Response:
    """Push model, the flat legacy envelope."""
    return await _execute(request, parse_notebook_execute)


async def _execute(request: Request, parse: Callable[[bytes], CellRequest]) -> Response:
    state = _state(request)
    with state.receiving_upload():  # held until the body is in (or refused and removed)
        with storage_checked("a new run directory"):
            run_dir = await offload(state.context.inline_io, RunDir.make, state.settings.run_root)
        root = run_dir.root
        try:
            with storage_checked("this request's inputs"):
                receiving = _receive(request, parse, run_dir, state)
                cell = await _unless_stalled(receiving, run_dir, state)
            job = submit(state, cell, run_dir)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, root, True)
            raise
    return await answer(request, state, job)


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
    state = _state(request)
    job = state.jobs.get(job_id)
    if job is None:
        raise NotFound("Unknown or expired job")
    job.polled_at = time.monotonic()  # someone is still after it (a drain waits for them)
    if job.done.is_set():
        return _deliver(state, job, polled=True)
    body: dict[str, object] = {"state": job.state.value}
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


@protected.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus metrics (behind the token gate when one is set)."""
    registry = _state(request).metrics.registry
    body = await asyncio.to_thread(generate_latest, registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@protected.post("/v1/executions/{build_id}/cancel")
async def cancel_execution(build_id: str, request: Request) -> JSONResponse:
    """Stop an in-flight execution of ``build_id``; its kernel is retired."""
    cancelled = _state(request).cancel(build_id)
    return JSONResponse({"build_id": build_id, "cancelled": cancelled})


@protected.post(
    "/v1/execute-manifest",
    responses={
        200: {"description": "Uploaded and finalized: success, build_id, byte_size, finalize"},
        **{k: v for k, v in _EXECUTE_RESPONSES.items() if k != 200},
    },
    openapi_extra=_MANIFEST_BODY,
)
async def execute_manifest(request: Request) -> Response:
    """Pull model: inputs from signed URLs, the bundle to the store, then finalize."""
    state = _state(request)
    return await answer(request, state, await submit_manifest(state, _body(request)))


@protected.post("/execute", openapi_extra=_MANIFEST_BODY)
async def execute_pool_alias(request: Request) -> Response:
    """strata-pool's path to the pull model (it posts the manifest with no content type);
    with ``--heartbeat-seconds``, a long run's answer streams (see :mod:`.heartbeat`)."""
    state = _state(request)
    interval = state.settings.heartbeat_seconds
    if interval is None:
        return await execute_manifest(request)
    job = await submit_manifest(state, _body(request))
    with state.jobs.awaited(job):
        async with watching_for_disconnect(request.receive, job.execution.cancel.set):
            ended = await ended_within(job, interval)
    if ended:
        return _deliver(state, job)
    timeout_status = state.settings.timeout_status
    return HeartbeatResponse(job, interval, lambda: _deliver(state, job), timeout_status)


router.include_router(protected)
