"""The probes and the metrics: ``/health`` (liveness and capabilities), ``/ready`` (a load
balancer's readiness) and ``/metrics``."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import JSONResponse, Response

from .. import __version__
from ..protocol.names import EXECUTOR_PROTOCOL, NOTEBOOK_PROTOCOL, OUTPUT_FORMAT, TRANSFORM_REF
from .routes import require_token

if TYPE_CHECKING:
    from ..state import WorkerState

__all__ = ["router"]

router = APIRouter()


def _state(request: Request) -> WorkerState:
    state: WorkerState = request.app.state.worker
    return state


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
            "features": _features(state),
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
            "memory": _memory(state),
        },
    }
    body["environments"] = {
        **state.environments.described(),
        "pools": [
            {
                "kind": pool.kind,
                "kernels": pool.kernels,
                "leases_now": pool.users,
                "idle_seconds": round(pool.idle_seconds, 1),
            }
            for pool in state.pools.stats()
            if not pool.default
        ],
        "pools_started": state.pools.pools_started,
        "pools_stopped": state.pools.pools_stopped,
    }
    if state.draining:
        body["status"] = "draining"
    return JSONResponse(body, status_code=200 if serving and not state.draining else 503)


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    """Readiness (a load balancer's probe): 200 only while a warm kernel exists and the
    worker is not stopping (draining, or in its ``--drain-notice`` before that), so traffic
    waits for the pool's warm-up and leaves before the drain refuses it."""
    state = _state(request)
    kernels = dict(state.pool.stats().kernels_by_state)
    stopping = state.withdrawn or state.draining
    is_ready = _warm_kernels(kernels) > 0 and not stopping
    body = {"ready": is_ready, "draining": state.draining, "stopping": stopping, "kernels": kernels}
    return JSONResponse(body, status_code=200 if is_ready else 503)


# HEAD for load balancers and uptime checks: the same answer without a body (uvicorn drops
# it); kept out of the schema, where it would repeat the GET operations' ids
router.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)
router.add_api_route("/ready", ready, methods=["HEAD"], include_in_schema=False)


def _features(state: WorkerState) -> dict[str, object]:
    """Advertise only what this worker implements (and, for locked environments, can do:
    uv was found and answered at start)."""
    return {
        "notebook_protocol_version": NOTEBOOK_PROTOCOL,
        "output_format": OUTPUT_FORMAT,
        "pull_model": True,
        "cancel": True,
        "output_dirs": True,
        "folder_inputs": True,
        "locked_environments": state.environments.enabled,
        "languages": ["python", "r"] if state.r_kernels.available else ["python"],
        "locked_r_environments": False,
        "mount_cache_probe": True,
    }


def _memory(state: WorkerState) -> dict[str, object]:
    """The default pool's memory as last measured in the background (see memory_watch)."""
    snapshot = state.memory.latest
    age = snapshot.age_seconds()
    return {
        **snapshot.of(state.pool.config.kind.name).as_dict(),
        "measured_seconds_ago": None if age is None else round(age, 3),
    }


def _free_slots(state: WorkerState) -> int:
    """Slots no lease holds; an id listed twice (two kernels sharing a GPU) counts twice."""
    busy = Counter(state.pool.stats().busy_slots)
    return sum((Counter(state.settings.gpu_slots) - busy).values())


@router.get("/metrics", dependencies=[Depends(require_token)])
async def metrics(request: Request) -> Response:
    """Prometheus metrics (behind the token gate when one is set)."""
    registry = _state(request).metrics.registry
    body = await asyncio.to_thread(generate_latest, registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
