"""The ASGI application: ``create_app`` and the lifespan that owns the kernel pool."""

from __future__ import annotations

import logging
import os
import pwd
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from starlette.responses import Response

from kernel_pool import (
    KernelKind,
    KernelSetup,
    PoolConfig,
    PoolSet,
    RecyclePolicy,
    ShippedPackage,
)

from .. import __version__, agent, tracing
from ..environments import EnvironmentStore, default_registry_url, default_root
from ..environments.kernels import LockedKernels
from ..errors import WorkerError, error_response
from ..execution import ExecutionContext
from ..jobs import JobQueue
from ..kernel_env import ALLOWLIST_ENV_VAR, kernel_environment, parse_allowlist
from ..languages import RKernels
from ..logs import PROBE_PATHS, RequestIdMiddleware
from ..memory_watch import MemoryWatch
from ..metrics import WorkerMetrics
from ..mounts.cache import MountCache
from ..runs.directory import KEPT_DIR_PREFIX
from ..runs.reuse import ReusableFiles
from ..settings import Settings, default_worker_id, memory_backed
from ..state import WorkerState
from .auth import SECRET_ENV_VARS
from .fastpath import FastPath
from .fleet import Fleet
from .health import router as health_router
from .lifespan import lifespan
from .openapi import OPENAPI_COMPONENTS
from .routes import execute_v1, notebook_execute, router
from .watch import watch_router

log = logging.getLogger(__name__)


def hardware_report() -> dict[str, object]:
    """CPU and memory of this machine (computed once at start-up)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return {"cpus": cpus, "memory_mb": psutil.virtual_memory().total // (1024 * 1024)}


def _read(path: str | None) -> str | None:
    if not path:
        return None
    with open(path, encoding="utf-8") as fh:
        return fh.read()


IOPUB_MESSAGE_BYTES = 1 << 19
"""The most a kernel's IOPub message may take: what the agent publishes stays under it
(console text goes out in pieces, display formats of 4 KiB or more as files), and past it
nothing is held. So a kernel holds the worker to its console cap plus a few MiB."""


AGENT_SETUP = KernelSetup(
    packages=(ShippedPackage(agent.AGENT_PACKAGE, Path(agent.__file__).parent),),
    install=agent.INSTALL,
)
"""What every kernel starts with: the agent, shipped and installed."""


def pool_config(settings: Settings, kernel_env: dict[str, str]) -> PoolConfig:
    return PoolConfig(
        size=settings.pool_size,
        spares=settings.spares,
        kind=KernelKind(
            kernel_name=settings.kernel_name,
            fork=settings.kernel_start == "fork",
            preload=_read(settings.preload),
            kernel_init=_read(settings.kernel_init),
        ),
        setup=AGENT_SETUP,
        recycle=settings.recycle,
        max_uses=settings.max_uses,
        max_kernel_memory=settings.max_kernel_memory,
        gpu_slots=settings.gpu_slots,
        env=kernel_env,
        kernel_user=settings.kernel_user,
        kernel_uids=settings.kernel_uids,
        interrupt_grace_seconds=settings.interrupt_grace_seconds,
        start_timeout_seconds=settings.kernel_start_timeout,
        max_iopub_message=IOPUB_MESSAGE_BYTES,
    )


def pool_set(settings: Settings, default: PoolConfig) -> PoolSet:
    """The worker's pool, and a pool per locked environment made on its first cell (its
    own size, no spares, no preload: ``--preload`` is for the worker's environment)."""

    def config_for(kind: KernelKind) -> PoolConfig:
        if kind.language == "r":
            return r_pool_config(settings, default, kind)
        return replace(default, kind=kind, size=settings.env_pool_size, spares=0)

    cap = settings.max_kernels or default.target_kernels + 4
    return PoolSet(default, config_for, max_kernels=cap)


def r_pool_config(settings: Settings, default: PoolConfig, kind: KernelKind) -> PoolConfig:
    """The R cells' pool: the worker's rules (recycle, uses, memory, users), its own size;
    spares only where no kernel is reused (``--recycle fresh``), no GPU slots."""
    fresh = settings.recycle is RecyclePolicy.FRESH
    spares = settings.spares if fresh else 0
    return replace(default, kind=kind, size=settings.r_pool_size, spares=spares, gpu_slots=())


def locked_kernels(settings: Settings, kernel_env: dict[str, str], pools: PoolSet) -> LockedKernels:
    """Locked environments as the settings say; uv is looked for when the lifespan starts."""

    def make_store(uv: str) -> EnvironmentStore:
        return EnvironmentStore(
            settings.env_root or default_root(),
            uv=uv,
            registry_url=settings.env_registry_url or default_registry_url(),
            allow_source_builds=settings.allow_source_builds,
            source_build_hint="--allow-source-builds on",
        )

    def keep() -> set[str]:  # environments with a live pool
        return {key for name in pools.in_use() if (key := environments.dir_key_of(name))}

    environments = LockedKernels(
        make_store if settings.locked_environments else None,
        kernel_env,
        max_disk=settings.env_max_disk,
        keep=keep,
        warm_template=pools.warm_template,
        warm_python="" if settings.env_warm_up else None,
    )
    return environments


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the worker application; the pool starts with the app's lifespan.

    Building it changes nothing in the process: the environment is read, not scrubbed, and
    no folder is made (see :mod:`kernel_worker.http.lifespan`).
    """
    settings = settings or Settings()
    environ = dict(os.environ)  # mount credentials are read from it; the lifespan scrubs
    mount_cache = MountCache.from_environ(environ)
    token = environ.get("STRATA_WORKER_TOKEN", "").strip()
    if settings.token is None and token:
        settings = replace(settings, token=token)
    if not settings.kernel_env_allowlist:  # an app built without the CLI reads it too
        allowlist = parse_allowlist(environ.get(ALLOWLIST_ENV_VAR, ""))
        settings = replace(settings, kernel_env_allowlist=allowlist)
    for name in SECRET_ENV_VARS:  # kernels never see them: the lifespan removes them
        environ.pop(name, None)
    kernel_env = kernel_environment(environ, settings.kernel_env_allowlist)
    if settings.kernel_env_allowlist:
        log.info(
            "kernels see %d of the worker's %d environment variables (allowlist)",
            len(kernel_env),
            len(environ),
        )
    pools = pool_set(settings, pool_config(settings, kernel_env))
    pool = pools.default
    environments = locked_kernels(settings, kernel_env, pools)
    memory = MemoryWatch(pools)
    if settings.worker_id is None:
        settings = replace(settings, worker_id=default_worker_id(settings.port))
    assert settings.worker_id is not None
    fleet = Fleet(settings.worker_id, settings.peers)
    jobs = JobQueue(
        max_queued=settings.queue_depth,
        ttl_seconds=settings.job_ttl_seconds,
        worker_id=settings.worker_id,
    )
    owner = _kernel_owner(settings)  # with one, the lifespan makes a private run root
    run_root = settings.run_root if settings.run_root is not None else Path(tempfile.gettempdir())
    inline_io = memory_backed(run_root)
    reusable = None
    if inline_io and owner is None and settings.file_reuse_bytes > 0:
        folder = run_root / f"{KEPT_DIR_PREFIX}{os.getpid()}"
        reusable = ReusableFiles(folder, settings.file_reuse_bytes)
    context = ExecutionContext(
        hardware_report(),
        settings.console_cap,
        owner,
        inline_io=inline_io,
        reuse=reusable,
        limits=settings.limits,
    )
    metrics = WorkerMetrics(
        pool,
        lambda: {
            "queue_depth": jobs.queued,
            "active_executions": state.active_executions,
            "kept_file_bytes": state.reusable_files.held_bytes if state.reusable_files else 0,
        },
        lambda: memory.latest.of(pool.config.kind.name),
    )
    metrics.watch_environments(pools, environments)
    fleet.observe = metrics.observe_forward
    state = WorkerState(
        settings, pool, context, jobs, metrics, mount_cache, pools, environments, memory
    )
    state.r_kernels = RKernels(settings.r_kernels)

    app = FastAPI(
        title="strata-kernel-worker",
        version=__version__,
        description="The Strata notebook executor protocol v1, served from warm Jupyter kernels.",
        lifespan=lifespan,
    )
    state.tracing = tracing.from_environ(environ, version=__version__, worker_id=settings.worker_id)
    app.state.worker = state
    app.state.fleet = fleet
    app.include_router(health_router)
    app.include_router(router)
    app.include_router(watch_router)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.add_exception_handler(WorkerError, _worker_error_handler)
    # the hot endpoints skip the router (the routes stay registered: schema, docs)
    hot = {"/v1/execute": execute_v1, "/v1/notebook-execute": notebook_execute}
    app.add_middleware(FastPath, endpoints=hot)
    quiet = frozenset() if settings.access_log_probes else PROBE_PATHS
    # added last: outermost, so it sees both paths
    app.add_middleware(RequestIdMiddleware, quiet_paths=quiet)
    return app


def _kernel_owner(settings: Settings) -> tuple[int, int] | None:
    """Who kernels run as when not as the worker: the one user, or (with a uid range) the
    range's first uid (each run directory is handed to its own kernel's uid)."""
    if settings.kernel_uids is not None:
        first = settings.kernel_uids[0]
        return first, first
    user = settings.kernel_user
    if user is None:
        return None
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ValueError(f"--kernel-user: no such user: {user!r}") from None
    return entry.pw_uid, entry.pw_gid


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the shapes the raw-body routes document by reference."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        schema.setdefault("components", {}).setdefault("schemas", {}).update(OPENAPI_COMPONENTS)
        app.openapi_schema = schema
    return app.openapi_schema


async def _worker_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, WorkerError)
    state: WorkerState = request.app.state.worker
    return error_response(exc, timeout_status=state.settings.timeout_status)
