"""The environments on this worker's disk: :class:`EnvironmentStore`.

``ensure(spec)`` answers with a complete environment for a checked spec, building it at most
once per lock and interpreter build across every process sharing the root::

    spec ─ find the interpreter (uv python find) ─ directory key ─ flock <key>.lock
        ├─ marker present ............................................ CACHED
        ├─ registry archive fetched, re-pointed and checked ............ FETCHED
        └─ uv sync --frozen --no-install-project [--no-build] ........ BUILT
    marker written last; a failed build leaves no environment behind

The blocking work runs in threads; one coroutine per environment and process waits on the
lock, the others wait on it in the loop. Kernel overlays (``overlay.py``) and disk use and
eviction (``disk.py``) hang off the same store and the same locks.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import shutil
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from . import disk, locking, overlay
from .errors import EnvironmentBuildError
from .layout import EnvironmentPaths, OverlayPaths, directory_key
from .registry import FetchOutcome, archive_url, fetch
from .sources import refuse_source_builds
from .spec import EnvironmentSpec
from .uv import Interpreter, find_interpreter, run_uv

__all__ = [
    "BuiltEnvironment",
    "EnvironmentOrigin",
    "EnvironmentStore",
    "default_registry_url",
    "default_root",
]

log = logging.getLogger(__name__)

ENV_ROOT_VAR = "STRATA_WORKER_ENV_ROOT"
REGISTRY_VAR = "STRATA_WORKER_ENV_REGISTRY_URL"
BUILD_TIMEOUT_SECONDS = 900.0


def default_root() -> Path:
    """``$STRATA_WORKER_ENV_ROOT``, else ``~/.strata/worker-envs``."""
    configured = os.environ.get(ENV_ROOT_VAR)
    return Path(configured) if configured else Path.home() / ".strata" / "worker-envs"


def default_registry_url() -> str | None:
    """``$STRATA_WORKER_ENV_REGISTRY_URL``, or None when unset or empty."""
    return os.environ.get(REGISTRY_VAR) or None


class EnvironmentOrigin(enum.Enum):
    CACHED = "cached"  # complete on disk already (built here, by a sibling, or by a reference)
    FETCHED = "fetched"  # unpacked from the registry by this call
    BUILT = "built"  # uv sync ran for this call


@dataclass(frozen=True, slots=True)
class BuiltEnvironment:
    """A complete environment: its marker is written and its interpreter is there."""

    dir_key: str  # the directory under the root: lock key and interpreter build
    path: Path  # the venv
    python: Path  # <path>/bin/python
    python_version: str  # major.minor of the interpreter, "3.12"
    lock_key: str  # the spec's key
    origin: EnvironmentOrigin  # how this call got it
    build: str = ""  # the interpreter build, "cpython-3.12.1 linux-x86_64"

    @property
    def installed(self) -> bool:
        """Whether this call put it on disk (the reference's bundle reports this)."""
        return self.origin is not EnvironmentOrigin.CACHED


class EnvironmentStore:
    """Locked environments under *root*, shared with other workers on the host.

    *uv* is the uv to run (see :func:`~.uv.probe_uv`); *registry_url* a registry to try before
    building; *allow_source_builds* lets uv build packages from source, which runs their code
    as the worker's user (off: such a lock fails with :class:`~.errors.SourceBuildRefused`,
    whose message names *source_build_hint* as the way to allow it).
    """

    def __init__(
        self,
        root: Path,
        *,
        uv: str,
        registry_url: str | None = None,
        allow_source_builds: bool = False,
        source_build_hint: str = "allow_source_builds=True",
        build_timeout_seconds: float = BUILD_TIMEOUT_SECONDS,
    ) -> None:
        self._root = root
        self._uv = uv
        self._registry = registry_url.rstrip("/") if registry_url else None
        self._allow_source_builds = allow_source_builds
        self._hint = source_build_hint
        self._timeout = build_timeout_seconds
        self._guards: dict[str, asyncio.Lock] = {}
        self._known: dict[tuple[str, str], BuiltEnvironment] = {}
        self._installer = overlay.Installer(
            uv, allow_source_builds, source_build_hint, build_timeout_seconds, self._use
        )
        self._users: dict[str, int] = {}  # overlay key -> our shared lock on its users file
        self._users_lock = threading.Lock()
        self._free: dict[str, tuple[str, ...]] = {}  # interpreter build -> kernel's packages

    @property
    def root(self) -> Path:
        return self._root

    async def ensure(self, spec: EnvironmentSpec) -> BuiltEnvironment:
        """The environment *spec* asks for, fetched or built if this root lacks it."""
        known = self._known.get((spec.key, spec.python))
        if known is not None and await asyncio.to_thread(_revisit, self._paths(known.dir_key)):
            return replace(known, origin=EnvironmentOrigin.CACHED)
        interpreter = await asyncio.to_thread(find_interpreter, self._uv, spec.python)
        paths = self._paths(directory_key(spec.key, interpreter.build))
        async with self._guard(paths.key):
            built = await asyncio.to_thread(self._prepare, spec, interpreter, paths)
        self._known[(spec.key, spec.python)] = built
        return built

    async def ensure_kernel_overlay(self, env: BuiltEnvironment) -> overlay.KernelOverlay:
        """The kernel overlay of *env*: a folder for the end of a kernel's ``sys.path``,
        shared with every environment of its interpreter build that resolves the same."""
        free = await self._free_resolution(env.build, env.python)
        paths = self._paths(env.dir_key)
        async with self._guard(f"overlay {paths.key}"):
            return await asyncio.to_thread(overlay.ensure, self._installer, paths, env.build, free)

    async def warm_kernel_overlay(self, python: str) -> tuple[Path, overlay.KernelOverlay]:
        """The shared overlay of the interpreter uv picks for *python* ("": its first),
        made ahead of any environment; with that interpreter."""
        interpreter = await asyncio.to_thread(find_interpreter, self._uv, python)
        free = await self._free_resolution(interpreter.build, interpreter.path)
        made = await asyncio.to_thread(
            overlay.ensure_shared,
            self._installer, self._root, interpreter.path, interpreter.build, free,
        )  # fmt: skip
        return interpreter.path, made

    async def _free_resolution(self, build: str, python: Path) -> tuple[str, ...]:
        """The kernel's packages for *build* with nothing pinned: resolved once per process."""
        async with self._guard(f"resolution {build}"):
            free = self._free.get(build)
            if free is None:
                free = await asyncio.to_thread(overlay.free_resolution, self._installer, python)
                self._free[build] = free
        return free

    async def usage(self) -> list[disk.EnvironmentUsage]:
        """Every complete environment under the root, least recently used first."""
        return await asyncio.to_thread(disk.usage, self._root)

    async def evict(
        self,
        *,
        max_bytes: int | None = None,
        max_idle_seconds: float | None = None,
        keep: Iterable[str] = (),
        keep_overlays: Iterable[str] | None = None,
    ) -> list[str]:
        """Remove environments idle too long, then the least recently used past *max_bytes*.

        Never one whose directory key is in *keep* (those with a live pool), nor one another
        process holds the lock of. Then kernel overlays nothing uses: this process stops
        using those not in *keep_overlays* (``None``: it keeps every one it used). Answers
        the directory keys removed.
        """
        removed = await asyncio.to_thread(
            disk.evict,
            self._root,
            max_bytes=max_bytes,
            max_idle_seconds=max_idle_seconds,
            keep=frozenset(keep),
        )
        if keep_overlays is not None:
            self._stop_using(set(keep_overlays))
        await asyncio.to_thread(disk.sweep_overlays, self._root)
        gone = set(removed)
        self._known = {k: env for k, env in self._known.items() if env.dir_key not in gone}
        return removed

    def _use(self, paths: OverlayPaths) -> None:
        """Mark the overlay at *paths* used by this process (from a thread)."""
        with self._users_lock:
            if paths.key not in self._users:
                self._users[paths.key] = locking.shared(paths.users)

    def _stop_using(self, keep: set[str]) -> None:
        with self._users_lock:
            for key in [key for key in self._users if key not in keep]:
                locking.release(self._users.pop(key))

    def close(self) -> None:
        """Stop marking overlays used (the process is done with its kernels)."""
        self._stop_using(set())

    def _paths(self, key: str) -> EnvironmentPaths:
        return EnvironmentPaths(self._root, key)

    def _guard(self, name: str) -> asyncio.Lock:
        return self._guards.setdefault(name, asyncio.Lock())

    def _prepare(
        self, spec: EnvironmentSpec, interpreter: Interpreter, paths: EnvironmentPaths
    ) -> BuiltEnvironment:
        try:
            self._root.mkdir(parents=True, exist_ok=True)
            with locking.held(paths.lock, timeout_seconds=self._timeout):
                origin = EnvironmentOrigin.CACHED
                # complete, unless its interpreter has gone since (a dangling bin/python)
                if not (paths.marker.exists() and paths.python.exists()):
                    origin = self._make(spec, interpreter, paths)
            paths.used.touch()
        except OSError as exc:
            raise EnvironmentBuildError(
                f"environment {paths.key} could not be prepared: {exc.strerror or exc}"
            ) from exc
        return BuiltEnvironment(
            dir_key=paths.key,
            path=paths.env,
            python=paths.python,
            python_version=interpreter.version,
            lock_key=spec.key,
            origin=origin,
            build=interpreter.build,
        )

    def _make(
        self, spec: EnvironmentSpec, interpreter: Interpreter, paths: EnvironmentPaths
    ) -> EnvironmentOrigin:
        """Fetch or build the environment; on any failure, remove what was made."""
        shutil.rmtree(paths.env, ignore_errors=True)  # a crashed build's leftovers
        try:
            origin = EnvironmentOrigin.BUILT
            if self._fetched(spec, interpreter, paths):
                origin = EnvironmentOrigin.FETCHED
            else:
                self._sync(spec, interpreter, paths)
            if not paths.python.exists():
                # marked complete, it would fail every cell and never be rebuilt
                raise _no_interpreter(paths)
            paths.marker.touch()
        except BaseException:
            shutil.rmtree(paths.env, ignore_errors=True)
            raise
        log.info("environment %s %s (%s)", paths.key, origin.value, interpreter.build)
        return origin

    def _fetched(
        self, spec: EnvironmentSpec, interpreter: Interpreter, paths: EnvironmentPaths
    ) -> bool:
        if self._registry is None:
            return False
        url = archive_url(self._registry, spec.key, interpreter.build)
        outcome = fetch(url, paths, interpreter, timeout_seconds=self._timeout)
        if outcome is not FetchOutcome.FETCHED:
            log.info("environment %s not fetched (%s); building it", paths.key, outcome.value)
        return outcome is FetchOutcome.FETCHED

    def _sync(
        self, spec: EnvironmentSpec, interpreter: Interpreter, paths: EnvironmentPaths
    ) -> None:
        paths.project.mkdir(parents=True, exist_ok=True)
        (paths.project / "pyproject.toml").write_text(spec.pyproject)
        (paths.project / "uv.lock").write_text(spec.lockfile)
        args = ["sync", "--frozen", "--no-install-project", "--python", str(interpreter.path)]
        if not self._allow_source_builds:
            args.append("--no-build")
        try:
            run_uv(
                self._uv,
                args,
                what="uv sync",
                cwd=paths.project,
                extra_env={"UV_PROJECT_ENVIRONMENT": str(paths.env)},
                timeout_seconds=self._timeout,
            )
        except EnvironmentBuildError as exc:
            if not self._allow_source_builds:
                refuse_source_builds(spec.lockfile, self._hint, exc)
            raise


def _revisit(paths: EnvironmentPaths) -> bool:
    """Whether a known environment is still complete; if so, note that it was used now."""
    try:
        if not (paths.marker.exists() and paths.python.exists()):
            return False
        paths.used.touch()
    except OSError:
        return False  # the full path reports it
    return True


def _no_interpreter(paths: EnvironmentPaths) -> EnvironmentBuildError:
    return EnvironmentBuildError(f"environment {paths.key} has no interpreter at {paths.python}")
