"""From a cell's locked environment to the kernel kind that runs it: :class:`LockedKernels`.

The worker asks one question per cell that names an environment: which kind of kernel runs
it. The answer is the environment's interpreter with its kernel overlay at the end of
``sys.path`` (the lock's packages win wherever both hold one), the environment's ``bin``
first on ``PATH``. With its interpreter build's shared overlay (the lock pins none of the
kernel's packages at another version), kernels are forked from a template of that
interpreter and overlay, shared by every such environment, which enter the environment
before any user code runs; with an overlay of its own, they are spawned. Never from the
worker's own template, whose preload is for the worker's environment. At start, the
shared overlay and template of the interpreter uv picks first are made ahead of any cell
(:meth:`LockedKernels.start`). Building the environment and its overlay happens here, at
most once per process at a time for one environment (the store's lock keeps other
processes out); a caller cancelled while a build runs stops waiting, and the build goes on
for the others.

Counters here feed ``/health`` and ``/metrics``: builds, cache hits, failures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kernel_pool import KernelKind, PoolError

from .disk import EnvironmentUsage
from .errors import LockedEnvironmentError
from .overlay import KernelOverlay
from .spec import EnvironmentSpec
from .store import BuiltEnvironment, EnvironmentOrigin, EnvironmentStore
from .uv import probe_uv

log = logging.getLogger(__name__)

__all__ = ["LockedKernels", "PreparedKind", "environment_kind"]


@dataclass(frozen=True, slots=True)
class PreparedKind:
    """An environment ready for kernels, and the kind that runs them."""

    kind: KernelKind
    environment: BuiltEnvironment
    overlay_key: str = ""


def environment_kind(
    env: BuiltEnvironment, overlay: KernelOverlay, base_env: Mapping[str, str]
) -> KernelKind:
    """The kind of kernel that runs cells in ``env``: forked from the shared template of
    its interpreter when its overlay is the shared one, else spawned."""
    path = base_env.get("PATH", "")
    site_packages = tuple(sorted(env.path.glob("lib/python*/site-packages")))
    return KernelKind(
        name=f"env-{env.dir_key[:16]}",
        python=env.python,
        python_path=(overlay.path,),
        env={
            "VIRTUAL_ENV": str(env.path),
            "PATH": f"{env.path / 'bin'}:{path}" if path else str(env.path / "bin"),
        },
        fork=overlay.shared and bool(site_packages),
        site_packages=site_packages if overlay.shared else (),
    )


class LockedKernels:
    """The kinds of kernel for locked environments, their builds shared and counted.

    ``make_store`` makes the store once :meth:`start` has found a working uv (``None``: the
    feature is off). Until then, or without uv, a cell that names an environment is
    answered with the reason, in the reference's words. ``max_disk`` (bytes) turns on
    eviction after each build, never of an environment in ``keep()`` (those with a live
    pool).
    """

    def __init__(
        self,
        make_store: Callable[[str], EnvironmentStore] | None,
        base_env: Mapping[str, str],
        *,
        max_disk: int | None = None,
        keep: Callable[[], set[str]] = set,
        warm_template: Callable[[Path, tuple[Path, ...]], Awaitable[None]] | None = None,
        warm_python: str | None = "",
    ) -> None:
        self.store: EnvironmentStore | None = None
        self._make_store = make_store
        self._base_env = dict(base_env)
        self._max_disk = max_disk
        self._keep = keep
        self._unavailable = (
            "uv is not installed on this worker"
            if make_store is not None
            else "locked environments are turned off on this worker"
        )
        self._ready: dict[tuple[str, str], PreparedKind] = {}
        self._preparing: dict[tuple[str, str], asyncio.Future[PreparedKind]] = {}
        self.counts: Counter[str] = Counter()  # built, fetched, cached, failed
        self.build_seconds = 0.0
        self.last_used: dict[str, float] = {}  # kind name -> monotonic time
        self.evicted = 0
        self.disk: list[EnvironmentUsage] = []  # measured at start and after each build
        self._warm_template = warm_template
        self._warm_python = warm_python  # made ready at start ("": uv's first; None: none)
        self._warm_overlays: set[str] = set()
        self._warming: asyncio.Future[None] | None = None
        self._warm_failed = False

    async def start(self) -> None:
        """Look for a uv that works (once: a worker does not gain or lose it later)."""
        if self._make_store is None:
            return
        uv = await asyncio.to_thread(probe_uv)
        if uv is None:
            log.info("no working uv: cells run in the worker's own environment only")
            return
        self.store = self._make_store(uv)
        self.disk = await self.store.usage()
        log.info("locked environments: built with %s under %s", uv, self.store.root)
        if self._warm_python is not None:
            self._warming = asyncio.ensure_future(self._warm(self.store, self._warm_python))

    @property
    def warm_up(self) -> str:
        """``off``, ``running``, ``done`` or ``failed``: what :meth:`start` began making
        ready ahead (it runs beside the serving: nothing waits for it but a cell that
        needs what it makes)."""
        if self._warming is None:
            return "off"
        if not self._warming.done():
            return "running"
        return "failed" if self._warm_failed else "done"

    async def aclose(self) -> None:
        """Stop a warm-up still running; stop marking overlays used."""
        if self._warming is not None and not self._warming.done():
            self._warming.cancel()
            await asyncio.wait({self._warming})
        if self.store is not None:
            await asyncio.to_thread(self.store.close)

    async def _warm(self, store: EnvironmentStore, python: str) -> None:
        """The shared overlay and fork template of *python*'s interpreter, made ahead."""
        started = time.monotonic()
        try:
            interpreter, overlay = await store.warm_kernel_overlay(python)
            self._warm_overlays.add(overlay.key)
            if self._warm_template is not None:
                real = await asyncio.to_thread(interpreter.resolve)  # as a kind names it
                await self._warm_template(real, (overlay.path,))
        except (LockedEnvironmentError, PoolError) as exc:
            self._warm_failed = True
            log.warning("locked environments: nothing made ready ahead: %s", exc)
            return
        log.info(
            "locked environments: overlay %s and its template ready in %.1fs",
            overlay.key[:16], time.monotonic() - started,
        )  # fmt: skip

    @property
    def enabled(self) -> bool:
        return self.store is not None

    async def prepare(self, spec: EnvironmentSpec) -> PreparedKind:
        """The kind for ``spec``, building its environment and overlay where needed.

        Raises:
            LockedEnvironmentError: It cannot be built here (the message is the user's).
        """
        if self.store is None:
            raise LockedEnvironmentError(self._unavailable)
        key = (spec.key, spec.python)
        ready = self._ready.get(key)
        if ready is not None:  # warm: no thread, no disk
            self.counts["cached"] += 1
            self.last_used[ready.kind.name] = time.monotonic()
            return ready
        preparing = self._preparing.get(key)
        if preparing is None:
            preparing = asyncio.ensure_future(self._prepare(self.store, spec))
            self._preparing[key] = preparing
            preparing.add_done_callback(lambda _: self._preparing.pop(key, None))
        # shielded: one caller cancelled (its client gone) leaves the build to the others
        prepared = await asyncio.shield(preparing)
        # later cells find it ready: for them it was cached, not installed
        cached = dataclasses.replace(prepared.environment, origin=EnvironmentOrigin.CACHED)
        self._ready[key] = PreparedKind(prepared.kind, cached)
        self.last_used[prepared.kind.name] = time.monotonic()
        return prepared

    def forget(self, dir_keys: set[str]) -> None:
        """Environments removed from disk (evicted): the next cell prepares them anew."""
        self._ready = {
            key: p for key, p in self._ready.items() if p.environment.dir_key not in dir_keys
        }

    def dir_key_of(self, kind_name: str) -> str | None:
        """The environment a kind of this object's runs in."""
        for prepared in self._ready.values():
            if prepared.kind.name == kind_name:
                return prepared.environment.dir_key
        return None

    async def _prepare(self, store: EnvironmentStore, spec: EnvironmentSpec) -> PreparedKind:
        started = time.monotonic()
        try:
            env = await store.ensure(spec)
            overlay = await store.ensure_kernel_overlay(env)
        except LockedEnvironmentError:
            self.counts["failed"] += 1
            raise
        self.counts[env.origin.value] += 1
        if env.installed:
            seconds = time.monotonic() - started
            self.build_seconds += seconds
            log.info(
                "environment %s %s in %.1fs (Python %s)",
                env.dir_key[:16], env.origin.value, seconds, env.python_version,
            )  # fmt: skip
        kind = environment_kind(env, overlay, self._base_env)
        prepared = PreparedKind(kind, env, overlay.key)
        log.debug(
            "environment %s: overlay %s (%s), kernels %s",
            env.dir_key[:16], overlay.key[:16], "shared" if overlay.shared else "its own",
            "forked" if kind.forks else "spawned",
        )  # fmt: skip
        if env.installed and self._max_disk is not None:
            keep = self._keep() | {env.dir_key}
            overlays = {p.overlay_key for p in self._ready.values()} | self._warm_overlays
            removed = await store.evict(
                max_bytes=self._max_disk, keep=keep, keep_overlays=overlays | {overlay.key}
            )
            self.forget(set(removed))
            self.evicted += len(removed)
        if env.installed:
            self.disk = await store.usage()
        return prepared

    def described(self) -> dict[str, object]:
        """What ``/health`` shows of locked environments (no disk walked here)."""
        return {
            "enabled": self.enabled,
            "warm_up": self.warm_up,
            "root": str(self.store.root) if self.store is not None else None,
            "prepared": dict(self.counts),
            "build_seconds": round(self.build_seconds, 3),
            "on_disk": len(self.disk),
            "disk_bytes": sum(entry.bytes for entry in self.disk),
            "evicted": self.evicted,
        }
