"""Pools by kernel kind: the default pool, and one more per kind, made on first use.

A :class:`PoolSet` owns a default pool, which is started with it and never stopped before
it, and starts a pool for any other kind the first time a lease asks for that kind.
Callers that ask for the same new kind wait on one start; a failed start fails each of
them and is tried again by the next caller. The live kernels of all pools together stay
within ``max_kernels``: to make room for a new pool, the idle pools used least recently
(no lease held or waited for) are stopped first; when none can be stopped, the new pool
waits until one can.

Kinds that fork from a template of another interpreter (``KernelKind.template``) share one
fork server per template across their pools: it is started by the first pool that needs
it, or ahead of any (:meth:`PoolSet.warm_template`), and stopped with the set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .config import PoolConfig
from .errors import PoolBusy, PoolClosed
from .forkserver import ForkServer
from .helper_source import shipped_packages
from .kinds import KernelKind
from .lease import Lease
from .pool import Pool
from .shipping import load_code

log = logging.getLogger(__name__)

__all__ = ["KindPoolStats", "PoolSet"]


@dataclass(frozen=True, slots=True)
class KindPoolStats:
    """What a :class:`PoolSet` knows of the pool of one kind."""

    kind: str
    kernels: int
    users: int
    """Leases held or waited for."""
    idle_seconds: float
    """Since its last lease ended (0 while used)."""
    default: bool


class _Entry:
    def __init__(self, pool: Pool, *, default: bool) -> None:
        self.pool = pool
        self.default = default
        self.users = 0
        self.last_used = time.monotonic()

    @property
    def kernels(self) -> int:
        return self.pool.config.target_kernels


class PoolSet:
    """The pools of a process, one per kernel kind."""

    def __init__(
        self,
        default: PoolConfig,
        config_for: Callable[[KernelKind], PoolConfig],
        *,
        max_kernels: int | None = None,
    ) -> None:
        """``default``: the pool started with the set; ``config_for``: the configuration
        of a pool of another kind; ``max_kernels``: the cap on kernels of all pools."""
        self._made: set[Pool] = set()  # every pool not closed yet, starting ones too
        self._templates: dict[tuple[Path, tuple[Path, ...]], ForkServer] = {}
        self._default = _Entry(self._new_pool(default), default=True)
        self._config_for = config_for
        self._max_kernels = max_kernels
        self._entries: dict[str, _Entry] = {default.kind.name: self._default}
        self._starting: dict[str, asyncio.Future[_Entry]] = {}
        self._changed = asyncio.Condition()
        self._reserved = 0  # kernels of pools starting, counted against the cap
        self._closed = False
        self.pools_started = 0
        self.pools_stopped = 0

    @property
    def default(self) -> Pool:
        return self._default.pool

    @contextlib.asynccontextmanager
    async def lease(
        self, kind: KernelKind | None = None, *, wait_seconds: float | None = None
    ) -> AsyncIterator[Lease]:
        """A lease on a kernel of ``kind`` (``None``: the default pool's), its pool started
        first where there is none yet."""
        entry = await self._entry_for(kind or self._default.pool.config.kind)
        try:
            async with entry.pool.lease(wait_seconds=wait_seconds) as lease:
                yield lease
        finally:
            await self._leave(entry)

    async def _entry_for(self, kind: KernelKind) -> _Entry:
        """The started pool of ``kind``, counted as used by the caller from now on."""
        while True:
            if self._closed:
                raise PoolClosed("the pools are shutting down")
            entry = self._entries.get(kind.name)
            if entry is not None:
                entry.users += 1
                return entry
            starting = self._starting.get(kind.name)
            if starting is None:
                starting = asyncio.ensure_future(self._start(kind))
                self._starting[kind.name] = starting
                starting.add_done_callback(lambda _: self._starting.pop(kind.name, None))
            # one start for every caller: a caller cancelled while waiting leaves it running
            await asyncio.shield(starting)

    async def _start(self, kind: KernelKind) -> _Entry:
        config = self._config_for(kind)
        await self._make_room(config.target_kernels)
        pool = self._new_pool(config)
        try:
            log.info("starting a pool of %d kernels of kind %s", config.target_kernels, kind.name)
            await pool.start()  # a failure has cleaned up after itself
        except BaseException:
            self._made.discard(pool)
            raise
        finally:
            self._reserved -= config.target_kernels
        entry = _Entry(pool, default=False)
        self._entries[kind.name] = entry
        self.pools_started += 1
        async with self._changed:
            self._changed.notify_all()
        return entry

    async def _make_room(self, kernels: int) -> None:
        """Stop least recently used idle pools until ``kernels`` more fit under the cap,
        waiting for pools to become idle when none can be stopped yet."""
        if self._max_kernels is None:
            self._reserved += kernels
            return
        if kernels + self._default.kernels > self._max_kernels:
            raise PoolBusy(
                f"a pool of {kernels} kernels does not fit in max_kernels={self._max_kernels}"
            )
        async with self._changed:
            while self._live_kernels() + kernels > self._max_kernels:
                victim = self._least_recently_used_idle()
                if victim is None:
                    await self._changed.wait()
                    continue
                await self._stop(victim)
            self._reserved += kernels

    def _live_kernels(self) -> int:
        return sum(e.kernels for e in self._entries.values()) + self._reserved

    def _new_pool(self, config: PoolConfig) -> Pool:
        def held_elsewhere() -> set[int]:
            return {uid for other in self._made if other is not pool for uid in other.held_uids()}

        template = config.kind.template
        shared = self._template(config, template) if template is not None else None
        pool = Pool(config, uids_elsewhere=held_elsewhere, fork_server=shared)
        self._made.add(pool)
        return pool

    def _template(self, config: PoolConfig, template: tuple[Path, tuple[Path, ...]]) -> ForkServer:
        server = self._templates.get(template)
        if server is None:
            env = config.env if config.env is not None else os.environ
            server = self._templates[template] = ForkServer(env, template)
        return server

    async def warm_template(self, python: Path, python_path: tuple[Path, ...]) -> None:
        """Start the template of ``python`` (resolved: no link) with ``python_path`` (a
        kind's ``template``)
        and load the in-kernel packages there, so that the first pool of any kind sharing
        it forks at once. Its kernels' configuration is the default pool's.

        Raises:
            KernelStartError: The template could not be started.
        """
        if self._closed:
            return
        config = self._default.pool.config
        server = self._template(config, (python, python_path))
        deadline = time.monotonic() + config.start_timeout_seconds
        await server.warm(load_code(shipped_packages(config)), deadline)

    def _least_recently_used_idle(self) -> _Entry | None:
        idle = [e for e in self._entries.values() if not e.default and e.users == 0]
        return min(idle, key=lambda e: e.last_used, default=None)

    async def _stop(self, entry: _Entry) -> None:
        name = entry.pool.config.kind.name
        del self._entries[name]
        log.info("stopping the idle pool of kind %s to make room", name)
        self.pools_stopped += 1
        try:
            await entry.pool.aclose()
        finally:
            self._made.discard(entry.pool)

    async def _leave(self, entry: _Entry) -> None:
        entry.users -= 1
        entry.last_used = time.monotonic()
        if entry.users == 0 and not entry.default:
            async with self._changed:
                self._changed.notify_all()

    # -- lifecycle and introspection --------------------------------------------------------

    async def start(self) -> None:
        """Start the default pool."""
        await self._default.pool.start()

    async def aclose(self) -> None:
        """Stop every pool: those started on demand first, the default last."""
        self._closed = True
        for starting in list(self._starting.values()):
            starting.cancel()
        await asyncio.gather(*self._starting.values(), return_exceptions=True)
        others = [e.pool for e in self._entries.values() if not e.default]
        self._entries = {self._default.pool.config.kind.name: self._default}
        await asyncio.gather(*(p.aclose() for p in others), return_exceptions=True)
        templates, self._templates = list(self._templates.values()), {}
        await asyncio.gather(*(t.aclose() for t in templates), return_exceptions=True)
        await self._default.pool.aclose()

    def pools(self) -> Mapping[str, Pool]:
        """The started pools by kind name, the default among them."""
        return {name: entry.pool for name, entry in self._entries.items()}

    def stats(self) -> list[KindPoolStats]:
        now = time.monotonic()
        return [
            KindPoolStats(
                kind=name,
                kernels=sum(e.pool.stats().kernels_by_state.values()),
                users=e.users,
                idle_seconds=0.0 if e.users else now - e.last_used,
                default=e.default,
            )
            for name, e in self._entries.items()
        ]

    def in_use(self) -> set[str]:
        """Kind names of pools started or starting (their environments must stay)."""
        return set(self._entries) | set(self._starting)
