"""The worker's lifespan: what starting the app does to the process, and the teardown.

Building the app (:func:`kernel_worker.http.app.create_app`) changes nothing in the
process. The lifespan does, in this order: the worker's secrets leave its environment, the
run root is made (and a private one inside it when kernels run as another user), the
metrics port listens, the kernels start; then the pull client, the fleet and the release
of idle kept files. Each step registers its undoing on one exit stack as soon as it is
done, so a start that fails or is cancelled undoes what it did, and teardown runs every
close even when an earlier one fails (that failure is raised after the last close).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from kernel_pool import KernelInitError, KernelStartError, Pool, PoolSet, PreloadError

from ..cancellation import cancel_and_wait
from ..metrics import WorkerMetrics
from ..pull.url_safety import UrlPolicy, guarded_client
from ..runs.directory import sweep_stale_run_dirs
from ..runs.reuse import ReusableFiles
from ..settings import Settings, prepare_run_root
from ..state import WorkerState
from .auth import scrub_secrets
from .connections import ConnectionLimits
from .fleet import Fleet
from .metrics_port import MetricsPort, start_metrics_port

log = logging.getLogger(__name__)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the worker built by ``create_app``, serve, and tear it down (see the module)."""
    state: WorkerState = app.state.worker
    fleet: Fleet = app.state.fleet
    async with AsyncExitStack() as stack:
        try:
            started = await _start(state, stack)
        except (KernelStartError, OSError, _SetupFailed) as exc:
            if state.end_server is None:  # an app served some other way: its host reports it
                raise
            await stack.aclose()
            state.startup_failure = _startup_failure(exc, state.settings)
            state.end_server()
            yield
            return
        if not started:  # stopped while starting: nothing to serve
            await stack.aclose()
            log.warning("stopped while the kernels were starting")
            yield
            return
        settings = state.settings
        log.info("warm pool ready: %d kernel(s)", settings.pool_size + settings.spares)
        if state.tracing.enabled:  # after the last job: its spans are sent too
            stack.push_async_callback(asyncio.to_thread, state.tracing.shutdown)
        stack.push_async_callback(state.jobs.aclose)
        client = guarded_client(UrlPolicy(settings.allow_local_hosts, settings.allowed_hosts))
        stack.push_async_callback(client.aclose)
        state.http_client = client
        stack.callback(_forget_client, state)
        fleet.open()
        stack.push_async_callback(fleet.aclose)
        releasing = _release_idle_files(state.reusable_files)
        stack.push_async_callback(cancel_and_wait, releasing)
        watching = asyncio.ensure_future(state.memory.run())
        stack.push_async_callback(cancel_and_wait, watching)
        yield


async def _start(state: WorkerState, stack: AsyncExitStack) -> bool:
    """Prepare the process and start the kernels, each step's undoing on ``stack``; False
    when a stop signal came first (the kernels begun are stopped)."""
    settings = state.settings
    scrub_secrets(os.environ)  # what the app needs of them it read when it was built
    try:
        await asyncio.to_thread(prepare_run_root, settings.run_root)
    except OSError as exc:
        raise _SetupFailed(f"--run-dir {settings.run_root}") from exc
    swept = await asyncio.to_thread(sweep_stale_run_dirs, settings.run_root)
    if swept:
        log.info("removed %d run directories left by workers that died", swept)
    if state.context.kernel_owner is not None:  # run dirs of one user's kernels: in a
        # parent they cannot list
        private = await asyncio.to_thread(_private_run_root, settings.run_root)
        stack.push_async_callback(_remove_tree, private)
        state.settings = replace(settings, run_root=private)
    if state.reusable_files is not None:
        stack.push_async_callback(asyncio.to_thread, state.reusable_files.close)
    stack.push_async_callback(state.pools.aclose)  # every environment's pool, then the default
    stack.push_async_callback(state.environments.aclose)  # (its warm-up stopped first)
    await state.environments.start()  # begins the environments' warm-up (--env-warm-up)
    await state.r_kernels.start()  # looks for R once; its pool starts on the first R cell
    # the metrics port first: one in use fails at once, not after the kernels start
    metrics_server = _serve_metrics(settings, state.metrics)
    if metrics_server is not None:
        stack.push_async_callback(metrics_server.aclose)
    return await _start_unless_stopped(state.pools, state.stop_requested)


def _forget_client(state: WorkerState) -> None:
    state.http_client = None


async def _remove_tree(path: Path) -> None:
    await asyncio.to_thread(shutil.rmtree, path, True)


def _private_run_root(parent: Path | None) -> Path:
    root = Path(tempfile.mkdtemp(prefix="skw-runs-", dir=parent))
    root.chmod(0o711)  # traversable to a known name, not listable
    return root


class _SetupFailed(Exception):
    """What an option named could not be set up: ``option`` says which, the cause why."""

    def __init__(self, option: str) -> None:
        super().__init__(option)
        self.option = option


def _startup_failure(exc: BaseException, settings: Settings) -> str:
    """What stopped the start, in one line for the operator."""
    if isinstance(exc, PreloadError):
        return f"the preload {settings.preload} failed: {exc}"
    if isinstance(exc, KernelInitError):
        return f"the kernel init {settings.kernel_init} failed: {exc}"
    if isinstance(exc, KernelStartError):
        return f"the kernels could not start: {exc}"
    if isinstance(exc, _SetupFailed):
        cause = exc.__cause__
        reason = getattr(cause, "strerror", None) or cause
        return f"{exc.option}: {reason}"
    return f"the kernels could not start: {type(exc).__name__}: {exc}"


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
        raise _SetupFailed(f"--metrics-port {settings.metrics_port}") from exc


async def _start_unless_stopped(pool: Pool | PoolSet, stop: asyncio.Event) -> bool:
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
