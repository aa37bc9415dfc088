"""``POST /v1/mount-cache/cached``: how much of a mount listing this machine already holds,
so the orchestrator can prefer a worker with a warm cache."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from kernel_worker.errors import BadRequest, WorkerError
from kernel_worker.mounts.cache import MountCache, object_key
from kernel_worker.mounts.specs import MountSpec, locate, parse_spec

__all__ = ["cached_bytes"]


async def cached_bytes(body: Mapping[str, object], cache: MountCache) -> list[int | None]:
    """``POST /v1/mount-cache/cached``: bytes of each listing this machine already holds.

    *body* is ``{"mounts": [{"spec": MountSpec | mapping, "entries": [{"key", "name",
    "etag", "mtime", "size"?}]}]}``. ``None`` where the share is unknowable: a rw or
    non-remote mount, or a credential this worker cannot resolve.

    Raises:
        BadRequest: *body* is not of that shape.
    """
    probes = _probes(body)
    return await asyncio.to_thread(lambda: [_cached(spec, e, cache) for spec, e in probes])


_ProbeEntry = tuple[str, int | None, str, str]  # key, size, etag, mtime


def _probes(body: Mapping[str, object]) -> list[tuple[MountSpec, list[_ProbeEntry]]]:
    mounts = body.get("mounts")
    if not isinstance(mounts, list):
        raise BadRequest("mounts must be a list")
    probes = []
    for index, item in enumerate(mounts):
        if not isinstance(item, Mapping) or not isinstance(item.get("entries"), list):
            raise BadRequest(f"mounts[{index}] must be an object with a spec and entries")
        spec = item.get("spec")
        spec = spec if isinstance(spec, MountSpec) else parse_spec(index, spec)
        entries: list[object] = item["entries"]
        probes.append((spec, [_probe_entry(index, entry) for entry in entries]))
    return probes


def _probe_entry(index: int, entry: object) -> _ProbeEntry:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("key"), str):
        raise BadRequest(f"mounts[{index}] entries must be objects with a string key")
    size = entry.get("size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool)):
        raise BadRequest(f"mounts[{index}] entry sizes must be integers")
    return str(entry["key"]), size, str(entry.get("etag", "")), str(entry.get("mtime", ""))


def _cached(spec: MountSpec, entries: list[_ProbeEntry], cache: MountCache) -> int | None:
    if spec.mode != "ro":
        return None
    try:
        location = locate(spec)
        options = cache.storage_options(spec.name, location.scheme, spec.credential, spec.options)
    except WorkerError:
        return None
    scope = cache.scope(options)
    return cache.cached_size(
        (
            object_key(
                location.protocol, scope, key, "" if size is None else str(size), etag, mtime
            ),
            size or 0,
        )
        for key, size, etag, mtime in entries
    )
