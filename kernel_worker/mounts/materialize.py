"""Mounts: remote object-store prefixes a cell reads (``ro``) or writes (``rw``) as folders.

One request, as the caller wires it::

    specs = parse_mounts(raw)                        # mount_specs: 400s before admission
    mounted = await materialize(specs, run_root, cache)
    ...the cell runs, each mount name bound to Path(mounted.paths[name])...
    writes = await sync_back(specs, mounted)         # after a successful cell only

**Read-only** mounts: the prefix is listed (fsspec ``find`` with details) and each object
is placed in a per-run *view*, ``run_root/mounts/<name>``, as a **hard link** to its blob
in the machine's :class:`~kernel_worker.mounts.cache.MountCache` (downloaded first when
the cache lacks that version). Hard links rather than symlinks, because

* the cell sees ordinary files: nothing resolves or walks into ``~/.strata``;
* a view survives eviction: a link keeps the inode, a symlink would dangle if a sweep
  removed its blob while the cell reads;
* a link has the blob's mode (0444), so writing into a view file fails as it should
  (and a write that gets through, as root or after ``chmod``, is caught by the cache's
  sentinel mtime and re-downloaded, never served to a later run).

Where the run directory and the cache are on different filesystems, files are copied
instead. View directories stay writable: the view belongs to one run, new names in it
touch nothing shared, and the run directory stays removable by a plain ``rmtree``.
``mount_bytes[name]`` is what this run downloaded (0 when every object was cached).

A read-only mount with a ``pin`` is listed once per worker: a later run with the same
pin, URI and options reuses that listing (as the reference reuses a pinned view), so it
sees the pinned contents even if the store has changed since. Its objects still come from
the cache, and are downloaded again only if a sweep evicted them; a remembered listing that
can no longer be placed (an evicted object the store no longer has) fails that run and is
forgotten, so the next run lists the store again.

**Read-write** mounts: current contents are copied into
``run_root/mount_cache/<name>_<12 hex>/staging``. :func:`sync_back` uploads each new or
changed regular file (size and mtime against what was staged) under the mount's URI,
skips symlinks, never propagates deletions, and reports what it wrote.

Errors: :class:`BadRequest` for specs and for a credential this worker does not define,
:class:`UpstreamFailed` for the store (unreachable, denied, missing, a hostile listing),
:class:`WorkerError` for local trouble. Details name the mount and its URI, never a
secret or a local path. All fsspec I/O runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import BinaryIO, Protocol, TypeVar

from kernel_worker.cancellation import wait_ended
from kernel_worker.errors import BadRequest, UpstreamFailed, WorkerError
from kernel_worker.mounts.cache import MountCache, Placement, Stopped, object_key
from kernel_worker.mounts.pins import pin_key
from kernel_worker.mounts.specs import Location, MountSpec, echo, locate, missing_backend
from kernel_worker.runs import files as run_files

__all__ = [
    "MaterializedMounts",
    "materialize",
    "sync_back",
]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SCHEMES = {"s3": "s3", "gs": "gs", "gcs": "gs", "az": "az", "azure": "az"}
_PROTOCOLS = {"s3": "s3", "gs": "gcs", "az": "abfs"}  # fsspec's names
_BACKENDS = {"s3": "s3fs", "gs": "gcsfs", "az": "adlfs"}
_BATCH = 16
_CHUNK = 1 << 20
_MAX_ECHO = 200
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Staged:
    """A read-write mount's local copy, and what it held before the cell ran."""

    directory: Path
    run_root: Path
    parts: tuple[str, ...]
    """``directory`` below ``run_root``: the cell can write in it, so it is reached through
    no link from there (see run_files)."""
    baseline: Mapping[str, tuple[int, int]]  # relative path -> (size, mtime_ns)
    options: Mapping[str, object] = field(repr=False)  # may hold secrets


@dataclass(frozen=True, slots=True)
class MaterializedMounts:
    """Where each mount is for the cell, and what read-only mounts downloaded."""

    paths: Mapping[str, str]  # mount name -> local directory (bind as a Path)
    mount_bytes: Mapping[str, int]  # ro mount name -> bytes downloaded this run
    staged: Mapping[str, _Staged] = field(default_factory=dict, repr=False)  # rw only


class _FileSystem(Protocol):
    """The slice of ``fsspec.AbstractFileSystem`` used here."""

    def find(
        self, path: str, *, withdirs: bool, detail: bool
    ) -> Mapping[str, Mapping[str, object]]: ...
    def get(self, rpath: list[str], lpath: list[str]) -> None: ...
    def open(self, path: str, mode: str) -> BinaryIO: ...


# --- materialize -----------------------------------------------------------------------


async def materialize(
    specs: Sequence[MountSpec], run_root: Path, cache: MountCache
) -> MaterializedMounts:
    """Make every mount a local directory under *run_root* (see the module docstring).

    Credentials and filesystems are resolved for all mounts before any I/O. If the
    request is cancelled, the worker thread stops after the download in flight and is
    waited for, so nothing writes into *run_root* once this returns.

    Raises:
        BadRequest: A credential is not defined here, or the options are refused.
        UpstreamFailed: The store could not be listed or read, or listed a hostile name.
        WorkerError: A local failure, or a credential reference that does not resolve.
    """
    if not specs:
        return MaterializedMounts(paths={}, mount_bytes={})
    return await _off_loop(functools.partial(_materialize, tuple(specs), run_root, cache))


def _materialize(
    specs: tuple[MountSpec, ...], run_root: Path, cache: MountCache, stop: threading.Event
) -> MaterializedMounts:
    prepared = []
    for spec in specs:
        location = locate(spec)
        options = cache.storage_options(spec.name, location.scheme, spec.credential, spec.options)
        prepared.append((spec, location, options, _filesystem(spec, location, options)))
    paths: dict[str, str] = {}
    moved: dict[str, int] = {}
    staged: dict[str, _Staged] = {}
    for spec, location, options, fs in prepared:
        if spec.mode == "ro":
            view = run_root / "mounts" / spec.name
            moved[spec.name] = _build_view(spec, location, fs, cache, options, view, stop)
            paths[spec.name] = str(view)
            logger.info("mount %s: view ready, %d bytes downloaded", spec.name, moved[spec.name])
        else:
            copy = _stage(spec, location, fs, options, run_root, stop)
            staged[spec.name] = copy
            paths[spec.name] = str(copy.directory)
            logger.info("mount %s: staged %d files", spec.name, len(copy.baseline))
    return MaterializedMounts(paths=paths, mount_bytes=moved, staged=staged)


def _filesystem(spec: MountSpec, location: Location, options: Mapping[str, object]) -> _FileSystem:
    """A fresh fsspec filesystem (no instance cache: no stale listings, no kept secrets)."""
    try:
        import fsspec  # type: ignore[import-untyped]

        fs: _FileSystem = fsspec.filesystem(
            location.protocol, **{**options, "skip_instance_cache": True}
        )
    except ImportError:  # find_spec saw it, but it does not import
        raise missing_backend(spec, location, ["fsspec", _BACKENDS[location.scheme]]) from None
    except Exception as exc:  # the backend refused the options
        raise BadRequest(
            f"Mount '{spec.name}': the storage options were refused ({type(exc).__name__})"
        ) from exc
    return fs


@dataclass(frozen=True, slots=True)
class _Entry:
    rel: str  # path inside the mount
    name: str  # the store's name for it (bucket/key)
    info: Mapping[str, object]


def _list(spec: MountSpec, location: Location, fs: _FileSystem) -> list[_Entry]:
    """Every object under the mount, each with a validated relative path."""
    try:
        found = fs.find(f"{location.protocol}://{location.path}", withdirs=False, detail=True)
    except Exception as exc:
        raise _upstream(spec, location, "list the mount", exc) from exc
    entries = []
    for raw_name, info in sorted(found.items()):
        name = raw_name.removeprefix(f"{location.protocol}://")
        if info.get("type") == "directory" or name.endswith("/"):
            continue  # a folder marker
        entries.append(_Entry(_relative(spec, location, name), name, info))
    rels = {entry.rel for entry in entries}
    for entry in entries:
        parts = entry.rel.split("/")
        if any("/".join(parts[:i]) in rels for i in range(1, len(parts))):
            raise UpstreamFailed(
                f"Mount '{spec.name}' rejected: the store holds both a file and a folder "
                f"at {echo(entry.rel)!r}"
            )
    return entries


def _relative(spec: MountSpec, location: Location, name: str) -> str:
    """*name*'s path under the mount, refusing any that would leave it."""
    if name == location.path:  # the mount names one object
        rel = name.rsplit("/", 1)[-1]
    elif name.startswith(location.path + "/"):
        rel = name[len(location.path) + 1 :]
    else:
        rel = ""
    if not rel or "\0" in rel or any(part in ("", ".", "..") for part in rel.split("/")):
        raise UpstreamFailed(
            f"Mount '{spec.name}' rejected: the store listed {echo(name)!r}, which is "
            "outside the mount root or not a safe relative path (path traversal)"
        )
    return rel


def _build_view(
    spec: MountSpec,
    location: Location,
    fs: _FileSystem,
    cache: MountCache,
    options: Mapping[str, object],
    view: Path,
    stop: threading.Event,
) -> int:
    scope = cache.scope(options)
    # a pinned mount is listed once: the same pin later reuses that listing, as the
    # reference reuses a pinned view, even if the store has changed since
    pinned = None
    placements = None
    if spec.pin is not None:
        pinned = pin_key(location.protocol, scope, location.path, spec.pin)
        placements = cache.pins.get(pinned)
    if placements is None:
        placements = tuple(
            Placement(
                rel=entry.rel,
                remote=entry.name,
                key=object_key(location.protocol, scope, entry.name, *_version(entry.info)),
                size=_size(entry.info),
            )
            for entry in _list(spec, location, fs)
        )
    try:
        moved = cache.place(placements, view, _fetcher(spec, location, fs), stop)
    except BaseException as exc:
        if pinned is not None:  # e.g. an evicted object the store no longer has
            cache.pins.forget(pinned)  # the next run lists the store again
        if isinstance(exc, OSError):
            raise _local(spec, "build the read-only view", exc) from exc
        raise
    if pinned is not None:
        cache.pins.remember(pinned, placements)
    return moved


def _stage(
    spec: MountSpec,
    location: Location,
    fs: _FileSystem,
    options: Mapping[str, object],
    run_root: Path,
    stop: threading.Event,
) -> _Staged:
    try:
        entries = _list(spec, location, fs)
    except UpstreamFailed as exc:
        # a bucket that does not exist (yet) stages as an empty folder, as in the reference:
        # a cell that writes nothing there succeeds, one that writes fails at the write-back
        if not isinstance(exc.__cause__, FileNotFoundError):
            raise
        entries = []
    if len(entries) == 1 and entries[0].name == location.path:
        raise BadRequest(f"Read-write mount '{spec.name}' must name a folder, not one object")
    digest = sha256(spec.uri.encode()).hexdigest()[:12]
    parts = ("mount_cache", f"{spec.name}_{digest}", "staging")
    staging = run_root.joinpath(*parts)
    fetch = _fetcher(spec, location, fs)
    try:
        staging.mkdir(parents=True)
        for start in range(0, len(entries), _BATCH):
            if stop.is_set():
                raise Stopped
            batch = entries[start : start + _BATCH]
            for entry in batch:
                (staging / entry.rel).parent.mkdir(parents=True, exist_ok=True)
            fetch([e.name for e in batch], [str(staging / e.rel) for e in batch])
        baseline = run_files.regular_files(run_root, parts)
    except OSError as exc:
        raise _local(spec, "stage the read-write copy", exc) from exc
    return _Staged(staging, run_root, parts, baseline, options)


def _fetcher(
    spec: MountSpec, location: Location, fs: _FileSystem
) -> Callable[[list[str], list[str]], None]:
    def fetch(remote: list[str], local: list[str]) -> None:
        try:
            fs.get(remote, local)
        except Exception as exc:
            raise _upstream(spec, location, "download from the mount", exc) from exc

    return fetch


def _version(info: Mapping[str, object]) -> tuple[str, str, str]:
    """(size, etag, mtime) as text, read as the reference's listing entries read them."""
    etag = info.get("ETag", info.get("etag", ""))
    mtime = info.get("LastModified", info.get("mtime", ""))
    return str(info.get("size", "")), str(etag), str(mtime)


def _size(info: Mapping[str, object]) -> int | None:
    size = info.get("size")
    return size if isinstance(size, int) and not isinstance(size, bool) else None


# --- sync back -------------------------------------------------------------------------


async def sync_back(
    specs: Sequence[MountSpec], materialized: MaterializedMounts
) -> list[dict[str, object]]:
    """Upload what the cell wrote through read-write mounts; the ``mount_writes`` entries.

    Call after a successful cell only. Each entry is ``{"mount", "uri", "files": [{"path",
    "size", "sha256"}]}``, for mounts the cell wrote through, files sorted by path.

    Raises:
        UpstreamFailed: An upload failed (earlier files may already be uploaded).
    """
    chosen = [
        (spec, materialized.staged[spec.name])
        for spec in specs
        if spec.mode == "rw" and spec.name in materialized.staged
    ]
    if not chosen:
        return []
    return await _off_loop(functools.partial(_sync_all, chosen))


def _sync_all(
    chosen: list[tuple[MountSpec, _Staged]], stop: threading.Event
) -> list[dict[str, object]]:
    writes: list[dict[str, object]] = []
    for spec, staged in chosen:
        location = locate(spec)
        fs = _filesystem(spec, location, staged.options)
        files = []
        try:
            states = run_files.regular_files(staged.run_root, staged.parts)
        except OSError:  # the cell replaced the folder (with a link): it wrote nothing there
            logger.warning("mount %s: its folder is gone or a link: nothing synced", spec.name)
            states = {}
        for rel, state in sorted(states.items()):
            if staged.baseline.get(rel) == state:
                continue
            if stop.is_set():
                raise Stopped
            written = _upload(spec, location, fs, staged, rel)
            if written is not None:
                files.append(written)
        if files:
            writes.append({"mount": spec.name, "uri": spec.uri, "files": files})
            logger.info("mount %s: synced %d files back", spec.name, len(files))
    return writes


def _upload(
    spec: MountSpec, location: Location, fs: _FileSystem, staged: _Staged, rel: str
) -> dict[str, object] | None:
    try:
        source = run_files.open_regular(staged.run_root, [*staged.parts, *rel.split("/")])
    except OSError:  # became a link, or went away, since the walk
        logger.warning("mount %s: not syncing a file that is a link or is gone", spec.name)
        return None
    digest, size = sha256(), 0
    with source:
        try:
            with fs.open(f"{location.protocol}://{location.path}/{rel}", "wb") as target:
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    target.write(chunk)
        except Exception as exc:
            raise _upstream(spec, location, "upload to the mount", exc) from exc
    return {"path": rel, "size": size, "sha256": digest.hexdigest()}


# --- plumbing --------------------------------------------------------------------------


async def _off_loop(work: Callable[[threading.Event], _T]) -> _T:
    """Run *work* in a thread; on cancellation, ask it to stop and wait until it has."""
    stop = threading.Event()
    task = asyncio.ensure_future(asyncio.to_thread(work, stop))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        stop.set()
        try:  # bounded by the transfer in flight; cancelled again, it still waits
            await wait_ended(task)
        finally:
            if not task.cancelled():
                task.exception()  # retrieved: the cancellation is what the caller sees
        raise


def _upstream(spec: MountSpec, location: Location, doing: str, exc: Exception) -> UpstreamFailed:
    """The store failed: a detail naming the mount and the kind of failure, no secrets."""
    if isinstance(exc, UpstreamFailed):
        return exc
    if isinstance(exc, PermissionError):
        reason = "access denied"
    elif isinstance(exc, FileNotFoundError):
        reason = "the bucket or object does not exist"
    elif isinstance(exc, ConnectionError | TimeoutError):
        reason = "the store could not be reached"
    else:
        reason = f"storage error ({type(exc).__name__})"
    logger.warning("mount %s: could not %s: %s: %s", spec.name, doing, type(exc).__name__, exc)
    return UpstreamFailed(f"Mount '{spec.name}' ({location.uri}): could not {doing}: {reason}")


def _local(spec: MountSpec, doing: str, exc: OSError) -> WorkerError:
    logger.error("mount %s: could not %s: %s", spec.name, doing, exc)
    return WorkerError(
        f"Mount '{spec.name}': could not {doing} on this worker ({type(exc).__name__})"
    )
