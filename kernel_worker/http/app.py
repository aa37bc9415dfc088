"""The ASGI application: ``create_app`` and the lifespan that owns the kernel pool."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from starlette.responses import Response

from kernel_pool import (
    KernelInitError,
    KernelKind,
    KernelStartError,
    Pool,
    PoolConfig,
    PreloadError,
)

from .. import __version__
from ..agent import fork_setup_code, forked_setup_code, setup_code
from ..cancellation import cancel_and_wait
from ..errors import WorkerError, error_response
from ..execution import ExecutionContext
from ..jobs import JobQueue
from ..kernel_env import ALLOWLIST_ENV_VAR, kernel_environment, parse_allowlist
from ..logs import RequestIdMiddleware
from ..metrics import WorkerMetrics
from ..mounts.cache import MountCache
from ..pull.url_safety import UrlPolicy, guarded_client
from ..runs.directory import KEPT_DIR_PREFIX, sweep_stale_run_dirs
from ..runs.reuse import ReusableFiles
from ..settings import Settings, default_worker_id, memory_backed, prepare_run_root
from ..state import WorkerState
from .auth import scrub_secrets
from .connections import ConnectionLimits
from .fastpath import FastPath
from .fleet import Fleet
from .health import router as health_router
from .metrics_port import MetricsPort, start_metrics_port
from .openapi import OPENAPI_COMPONENTS
from .routes import execute_v1, notebook_execute, router

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
        setup_code=setup_code(),
        fork_setup_code=fork_setup_code(),
        forked_setup_code=forked_setup_code(),
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


def _startup_failure(exc: BaseException, settings: Settings) -> str:
    """What stopped the start, in one line for the operator."""
    if isinstance(exc, PreloadError):
        return f"the preload {settings.preload} failed: {exc}"
    if isinstance(exc, KernelInitError):
        return f"the kernel init {settings.kernel_init} failed: {exc}"
    if isinstance(exc, KernelStartError):
        return f"the kernels could not start: {exc}"
    if isinstance(exc, _MetricsPortFailed):
        cause = exc.__cause__
        reason = getattr(cause, "strerror", None) or cause
        return f"--metrics-port {settings.metrics_port}: {reason}"
    return f"the kernels could not start: {type(exc).__name__}: {exc}"


async def _start_unless_stopped(pool: Pool, stop: asyncio.Event) -> bool:
    """Start the pool; False if ``stop`` was set first (the start is cancelled, and every
    kernel it had begun is stopped). A start failure is raised."""
    starting = asyncio.ensure_future(pool.start())
    stopping = asyncio.ensure_future(stop.wait())
    cut_short = False
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # stopped, or this wait itself cancelled: the start has ended before we go on
        stopping.cancel()
        if not starting.done():
            cut_short = True
            await _cancel_until_ended(starting)
    if not cut_short:
        starting.result()
        return True
    with contextlib.suppress(BaseException):  # a start cut short may fail any way it likes
        starting.result()
    return False


async def _cancel_until_ended(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` (again if need be: Python 3.11's wait_for can swallow a cancellation
    that comes as its inner wait ends) until it has ended; a cancellation of this wait is
    raised then, so that the kernels the start had begun are stopped before the caller
    goes on."""
    interrupted: asyncio.CancelledError | None = None
    while not task.done():
        task.cancel()
        try:
            await asyncio.wait({task}, timeout=0.2)
        except asyncio.CancelledError as exc:  # ours: asyncio.wait raises none of the task's
            interrupted = exc
    if interrupted is not None:
        raise interrupted


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the worker application; the pool starts with the app's lifespan."""
    settings = settings or Settings()
    environ = dict(os.environ)  # mount credentials are read from it, then scrubbed below
    mount_cache = MountCache.from_environ(environ)
    secrets = scrub_secrets(os.environ)
    if settings.token is None and secrets.get("STRATA_WORKER_TOKEN", "").strip():
        settings = replace(settings, token=secrets["STRATA_WORKER_TOKEN"].strip())
    if not settings.kernel_env_allowlist:  # an app built without the CLI reads it too
        allowlist = parse_allowlist(os.environ.get(ALLOWLIST_ENV_VAR, ""))
        settings = replace(settings, kernel_env_allowlist=allowlist)
    kernel_env = kernel_environment(os.environ, settings.kernel_env_allowlist)
    if settings.kernel_env_allowlist:
        log.info(
            "kernels see %d of the worker's %d environment variables (allowlist)",
            len(kernel_env),
            len(os.environ),
        )
    pool = Pool(pool_config(settings, kernel_env))
    if settings.worker_id is None:
        settings = replace(settings, worker_id=default_worker_id(settings.port))
    assert settings.worker_id is not None
    fleet = Fleet(settings.worker_id, settings.peers)
    jobs = JobQueue(
        max_queued=settings.queue_depth,
        ttl_seconds=settings.job_ttl_seconds,
        worker_id=settings.worker_id,
    )
    owner = _kernel_owner(settings)
    prepare_run_root(settings.run_root)
    if owner is not None:  # run dirs of one user's kernels: in a parent they cannot list
        settings = replace(settings, run_root=_private_run_root(settings.run_root))
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
    )
    state = WorkerState(settings, pool, context, jobs, metrics, mount_cache)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        swept = await asyncio.to_thread(sweep_stale_run_dirs, settings.run_root)
        if swept:
            log.info("removed %d run directories left by workers that died", swept)
        metrics_server = None
        failure: BaseException | None = None
        try:
            # the metrics port first: one in use fails at once, not after the kernels start
            metrics_server = _serve_metrics(settings, metrics)
            started = await _start_unless_stopped(pool, state.stop_requested)
        except (KernelStartError, OSError, _MetricsPortFailed) as exc:
            if state.end_server is None:  # an app served some other way: its host reports it
                if metrics_server is not None:
                    await metrics_server.aclose()
                raise
            started, failure = False, exc
        if not started:  # stopped while starting, or failed: nothing to serve
            if metrics_server is not None:
                await metrics_server.aclose()
            await pool.aclose()
            if failure is None:
                log.warning("stopped while the kernels were starting")
            elif state.end_server is not None:
                state.startup_failure = _startup_failure(failure, settings)
                state.end_server()
            yield
            return
        log.info("warm pool ready: %d kernel(s)", settings.pool_size + settings.spares)
        client = guarded_client(UrlPolicy(settings.allow_local_hosts, settings.allowed_hosts))
        state.http_client = client
        fleet.open()
        releasing = _release_idle_files(state.reusable_files)
        try:
            yield
        finally:
            state.http_client = None
            await client.aclose()
            await fleet.aclose()
            await cancel_and_wait(releasing)
            if metrics_server is not None:
                await metrics_server.aclose()
            await jobs.aclose()
            await pool.aclose()
            if state.reusable_files is not None:
                await asyncio.to_thread(state.reusable_files.close)
            if owner is not None and settings.run_root is not None:
                await asyncio.to_thread(shutil.rmtree, settings.run_root, True)

    app = FastAPI(
        title="strata-kernel-worker",
        version=__version__,
        description="The Strata notebook executor protocol v1, served from warm Jupyter kernels.",
        lifespan=lifespan,
    )
    app.state.worker = state
    app.state.fleet = fleet
    app.include_router(health_router)
    app.include_router(router)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.add_exception_handler(WorkerError, _worker_error_handler)
    # the hot endpoints skip the router (the routes stay registered: schema, docs)
    hot = {"/v1/execute": execute_v1, "/v1/notebook-execute": notebook_execute}
    app.add_middleware(FastPath, endpoints=hot)
    app.add_middleware(RequestIdMiddleware)  # added last: outermost, so it sees both paths
    return app


def _release_idle_files(files: ReusableFiles | None) -> asyncio.Future[None]:
    """The task that removes kept files no request took in time (see file_reuse)."""

    async def release() -> None:
        if files is None:
            return
        while True:
            await asyncio.sleep(files.idle_seconds / 4)
            if files.count:
                await asyncio.to_thread(files.release_idle)

    return asyncio.ensure_future(release())


def _private_run_root(parent: Path | None) -> Path:
    root = Path(tempfile.mkdtemp(prefix="skw-runs-", dir=parent))
    root.chmod(0o711)  # traversable to a known name, not listable
    return root


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


class _MetricsPortFailed(Exception):
    """The metrics server could not listen (its cause says why)."""


def _serve_metrics(settings: Settings, metrics: WorkerMetrics) -> MetricsPort | None:
    """With ``--metrics-port``, expose /metrics there (no token) besides the gated route,
    under the main port's connection limits."""
    if settings.metrics_port is None:
        return None
    limits = ConnectionLimits(
        header_seconds=settings.header_timeout_seconds,
        max_connections=settings.max_connections,
        send_seconds=settings.send_timeout_seconds,
    )
    try:
        return start_metrics_port(
            settings.host, settings.metrics_port, metrics.registry, limits, settings.log_level
        )
    except OSError as exc:
        raise _MetricsPortFailed from exc


async def _worker_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, WorkerError)
    state: WorkerState = request.app.state.worker
    return error_response(exc, timeout_status=state.settings.timeout_status)
