"""The machine's read-only mount cache: each remote object downloaded once per version.

Layout under ``root`` (``STRATA_NOTEBOOK_MOUNT_CACHE_DIR``, default
``~/.strata/mount_cache``)::

    blobs/<2 hex>/<64 hex>   one remote object at one version; mode 0444
    blobs/.tmp-<32 hex>      a download in flight (swept once a day old)

A blob's name is :func:`object_key`: a digest of the protocol, the *scope* (a digest of
the storage options that reached the store, so a credential only ever reuses what it
fetched itself), the object's name, and its version (size, etag, mtime). An object with
neither etag nor mtime has no version and is never cached.

Runs do not read blobs in place: :meth:`MountCache.place` hard-links them into a per-run
view directory (see :mod:`kernel_worker.mounts.materialize`). A hard link shares the inode, so a
blob's mode (0444) is the view file's mode, and a write through a view would change the
cached bytes for every later run. The permission bits stop an ordinary write; a cell
running as root, or one that ``chmod``\\s its view file first, is not stopped, so every
blob also carries a fixed sentinel mtime (:data:`PRISTINE_MTIME_NS`). Any write moves
the mtime, and a blob whose mtime or size is off is discarded and downloaded again
instead of being handed to the next run. A blob's atime is its last use (set
explicitly, whatever the mount's atime policy), which is the order eviction follows.

:meth:`MountCache.sweep` keeps the blobs under ``max_bytes`` (0: no cap) and drops those
unused for ``max_idle_days`` (0: no limit), least recently used first. Eviction is safe
while runs read: a view's hard link keeps the inode alive until the run's directory goes.

The cache also owns the worker's mount credentials (named fsspec option dicts whose
values may be ``${VAR}`` or ``${file:/abs/path}`` references), since a scope is a digest
of the options they resolve to. This layout is not the reference's (its ``objects/`` and
``views/``); the two implementations do not share cached files.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

from kernel_worker.errors import BadRequest, WorkerError
from kernel_worker.mounts.options import check_options
from kernel_worker.mounts.pins import PinnedListings

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_IDLE_DAYS",
    "PRISTINE_MTIME_NS",
    "Fetch",
    "MountCache",
    "Placement",
    "Stopped",
    "object_key",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 20 * 1024**3
DEFAULT_MAX_IDLE_DAYS = 30.0
PRISTINE_MTIME_NS = 1_000_000_000 * 1_000_000_000
"""Every blob's mtime (2001-09-09T01:46:40Z); a write through a view moves it."""

_SWEEP_INTERVAL_SECONDS = 600.0
_STALE_TEMP_SECONDS = 86400.0
_DOWNLOAD_BATCH = 16
_SCHEME_ALIASES = {"gcs": "gs", "azure": "az"}

Fetch = Callable[[list[str], list[str]], None]
"""Downloads remote names to local paths, pairwise (``fs.get`` with two lists)."""


class Stopped(Exception):
    """The run that asked for the work was cancelled; raised between downloads."""


@dataclass(frozen=True, slots=True)
class Placement:
    """One file of a view: where it goes, what to fetch, and its cache identity."""

    rel: str  # validated relative POSIX path inside the view
    remote: str  # the name to fetch
    key: str | None  # object_key(); None: the object has no version, never cached
    size: int | None  # listed size, when the listing had one


def object_key(
    protocol: str, scope: str, name: str, size: str, etag: str, mtime: str
) -> str | None:
    """The cache identity of remote object *name* at one version, or None without one."""
    if not etag and not mtime:
        return None
    return sha256("\0".join([protocol, scope, name, size, etag, mtime]).encode()).hexdigest()


class MountCache:
    """Read-only remote mount data under *root*, shared by every run on the machine.

    Args:
        root: The cache directory (created on first use).
        max_bytes: Bound on the cached bytes; 0 means no bound.
        credentials: Named fsspec option dicts; string values may be references.
        scheme_defaults: Credential name to apply first for each scheme (``s3``, ``gs``,
            ``az``).
        environ: Where ``${VAR}`` references resolve (a snapshot; default: none do).
        max_idle_days: Blobs unused this long are dropped; 0 means never.

    Raises:
        ValueError: A scheme default names a credential that is not defined.
    """

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int,
        credentials: Mapping[str, Mapping[str, object]],
        scheme_defaults: Mapping[str, str],
        environ: Mapping[str, str] | None = None,
        max_idle_days: float = DEFAULT_MAX_IDLE_DAYS,
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.max_idle_seconds = max_idle_days * 86400.0
        self._blobs = root / "blobs"
        self._credentials = {name: dict(fields) for name, fields in credentials.items()}
        self._defaults = {_SCHEME_ALIASES.get(k, k): v for k, v in scheme_defaults.items()}
        self._environ = dict(environ or {})
        self._sweep_lock = threading.Lock()
        self._last_sweep = -math.inf
        self.pins: PinnedListings[Placement] = PinnedListings()
        for scheme, name in self._defaults.items():
            if name not in self._credentials:
                raise ValueError(
                    f"STRATA_NOTEBOOK_MOUNT_CREDENTIALS names credential {name!r} for "
                    f"{scheme}, which STRATA_NOTEBOOK_CREDENTIALS does not define"
                )

    @staticmethod
    def check_environ(environ: Mapping[str, str]) -> None:
        """Raise ``ValueError`` (saying which variable) when a credential variable in
        *environ* is not what it must be; creates nothing."""
        _credentials_from(environ)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> MountCache:
        """The cache and credentials the ``STRATA_NOTEBOOK_*`` variables in *environ* set.

        Read from the mapping, not ``os.environ``: the credential variables are secrets
        the worker removes from its environment before kernels start.

        Raises:
            ValueError: A credential variable is not the JSON object it must be.
        """
        credentials, defaults = _credentials_from(environ)
        configured = environ.get("STRATA_NOTEBOOK_MOUNT_CACHE_DIR")
        home = environ.get("HOME")
        root = (
            Path(configured).expanduser()
            if configured
            else (Path(home) if home else Path.home()) / ".strata" / "mount_cache"
        )
        return cls(
            root,
            max_bytes=int(
                _number(environ, "STRATA_NOTEBOOK_MOUNT_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES)
            ),
            credentials=credentials,
            scheme_defaults=defaults,
            environ=environ,
            max_idle_days=_number(
                environ, "STRATA_NOTEBOOK_MOUNT_CACHE_MAX_IDLE_DAYS", DEFAULT_MAX_IDLE_DAYS
            ),
        )

    # --- credentials ---

    def storage_options(
        self, mount: str, scheme: str, credential: str | None, options: Mapping[str, object]
    ) -> dict[str, object]:
        """fsspec options for mount *mount*: the request's *options*, then the scheme
        default's, then its named credential's: what the operator configured is never
        overridden.

        *options* may only hold what :mod:`kernel_worker.mounts.options` allows (checked
        again here: this merge is where a request's options meet the worker's identity).
        Blocking when a reference names a file: call it from a thread.

        Raises:
            BadRequest: *credential* is not defined on this worker, or *options* sets
                something a request may not.
            WorkerError: A reference in a credential does not resolve here.
        """
        scheme = _SCHEME_ALIASES.get(scheme, scheme)
        check_options(mount, scheme, options)
        merged: dict[str, object] = dict(options)
        for name in (self._defaults.get(scheme), credential):
            if name:
                merged.update(self._resolve(name))
        return merged

    def _resolve(self, name: str) -> dict[str, object]:
        fields = self._credentials.get(name)
        if fields is None:
            raise BadRequest(
                f"credential {name!r} is not defined on this worker (STRATA_NOTEBOOK_CREDENTIALS)"
            )
        try:
            return {key: _resolve_references(value, self._environ) for key, value in fields.items()}
        except _Unresolved as exc:
            raise WorkerError(f"credential {name!r} {exc}") from None

    @staticmethod
    def scope(options: Mapping[str, object]) -> str:
        """A digest of the options that reach the store: the cache partition they read."""
        text = json.dumps(options, sort_keys=True, default=str)
        return sha256(text.encode()).hexdigest()

    # --- blobs ---

    def _blob(self, key: str) -> Path:
        return self._blobs / key[:2] / key

    def cached_size(self, objects: Iterable[tuple[str | None, int]]) -> int:
        """The bytes of the ``(object key, size)`` pairs held here, untouched and intact."""
        total = 0
        for key, size in objects:
            if key is None:
                continue
            try:
                st = self._blob(key).lstat()
            except OSError:
                continue
            if _intact(st, size):
                total += size
        return total

    def place(
        self, files: Sequence[Placement], view: Path, fetch: Fetch, stop: threading.Event
    ) -> int:
        """Fill the new directory *view* with read-only *files*; the bytes downloaded.

        Cached blobs are hard-linked (copied where the view is on another filesystem);
        the rest are fetched in batches, linked into the view, then kept as blobs.
        Blocking: call it from a thread.

        Raises:
            Stopped: *stop* was set between two batches.
        """
        _mkdir_private(self._blobs)
        view.mkdir(parents=True)
        missing: list[Placement] = []
        for placement in files:
            dest = view / placement.rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if placement.key is None or not self._link_cached(placement, dest):
                missing.append(placement)
        downloaded = 0
        for start in range(0, len(missing), _DOWNLOAD_BATCH):
            if stop.is_set():
                raise Stopped
            downloaded += self._download(missing[start : start + _DOWNLOAD_BATCH], view, fetch)
        self._maybe_sweep(grew=downloaded > 0)
        return downloaded

    def _link_cached(self, placement: Placement, dest: Path) -> bool:
        assert placement.key is not None
        blob = self._blob(placement.key)
        try:
            st = blob.lstat()
        except FileNotFoundError:
            return False
        if not _intact(st, placement.size):
            logger.warning("mount cache: blob %s was modified; fetching it again", blob.name[:12])
            blob.unlink(missing_ok=True)
            return False
        try:
            _link_or_copy(blob, dest)
        except FileNotFoundError:
            return False  # evicted between the look and the link
        _touch(blob)
        return True

    def _download(self, batch: Sequence[Placement], view: Path, fetch: Fetch) -> int:
        temps = [self._blobs / f".tmp-{uuid.uuid4().hex}" for _ in batch]
        try:
            fetch([p.remote for p in batch], [str(t) for t in temps])
            downloaded = 0
            for placement, temp in zip(batch, temps, strict=True):
                size = temp.stat().st_size
                downloaded += size
                temp.chmod(0o444)
                _touch(temp)
                _link_or_copy(temp, view / placement.rel)
                if placement.key is not None and placement.size in (None, size):
                    blob = self._blob(placement.key)
                    _mkdir_private(blob.parent)
                    os.replace(temp, blob)
                # else: not cacheable, or changed while listed; the view keeps its copy
            return downloaded
        finally:
            for temp in temps:
                temp.unlink(missing_ok=True)

    # --- eviction ---

    def _maybe_sweep(self, *, grew: bool) -> None:
        if grew or time.monotonic() - self._last_sweep > _SWEEP_INTERVAL_SECONDS:
            self.sweep()

    def sweep(self) -> None:
        """Drop idle blobs, then least recently used ones until under ``max_bytes``.

        Blocking; at most one sweep runs at a time per cache (others return at once).
        """
        if not self._sweep_lock.acquire(blocking=False):
            return
        try:
            self._last_sweep = time.monotonic()
            self._sweep(time.time())
        finally:
            self._sweep_lock.release()

    def _sweep(self, now: float) -> None:
        blobs: list[tuple[float, int, Path]] = []
        for path in _blob_paths(self._blobs):
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            if path.name.startswith(".tmp-"):
                # ctime: a download's mtime is set to the sentinel before it is kept
                if now - st.st_ctime > _STALE_TEMP_SECONDS:
                    path.unlink(missing_ok=True)
                continue
            blobs.append((st.st_atime, st.st_size, path))
        blobs.sort()
        total = sum(size for _used, size, _path in blobs)
        evicted = 0
        for used, size, path in blobs:
            idle = self.max_idle_seconds > 0 and now - used > self.max_idle_seconds
            over = self.max_bytes > 0 and total > self.max_bytes
            if not (idle or over):
                break  # oldest first: nothing later is idle, and the total only fell
            path.unlink(missing_ok=True)
            total -= size
            evicted += 1
        if evicted:
            logger.info("mount cache: evicted %d blobs, %d bytes kept", evicted, total)


class _Unresolved(Exception):
    """A ``${...}`` reference in a credential that does not resolve (says which)."""


def _resolve_references(value: object, environ: Mapping[str, str]) -> object:
    """*value* with every string that is exactly ``${VAR}``/``${file:/path}`` resolved."""
    if isinstance(value, dict):
        return {k: _resolve_references(v, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_references(v, environ) for v in value]
    if not (isinstance(value, str) and value.startswith("${") and value.endswith("}")):
        return value
    name = value[2:-1]
    if name.startswith("file:"):
        path = Path(name.removeprefix("file:"))
        if not path.is_absolute():
            raise _Unresolved("references a ${file:...} that is not an absolute path")
        try:
            return path.read_text().rstrip("\r\n")
        except OSError:
            raise _Unresolved("references a ${file:...} that cannot be read here") from None
    if name not in environ:
        raise _Unresolved(f"references ${{{name}}}, which is not set on this worker")
    return environ[name]


def _credentials_from(
    environ: Mapping[str, str],
) -> tuple[dict[str, dict[str, object]], dict[str, str]]:
    """The named credentials and each scheme's default credential name."""
    credentials: dict[str, dict[str, object]] = {}
    for name, fields in _json_object(environ, "STRATA_NOTEBOOK_CREDENTIALS").items():
        if not isinstance(fields, dict):
            raise ValueError("STRATA_NOTEBOOK_CREDENTIALS must map names to objects")
        credentials[name] = fields
    defaults: dict[str, str] = {}
    for scheme, default in _json_object(environ, "STRATA_NOTEBOOK_MOUNT_CREDENTIALS").items():
        if not isinstance(default, str):
            raise ValueError("STRATA_NOTEBOOK_MOUNT_CREDENTIALS must map schemes to names")
        defaults[scheme.lower()] = default
    return credentials, defaults


def _json_object(environ: Mapping[str, str], variable: str) -> dict[str, object]:
    raw = (environ.get(variable) or "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise ValueError(f"{variable} is not valid JSON") from None
    if not isinstance(value, dict):
        raise ValueError(f"{variable} must be a JSON object")
    return value


def _number(environ: Mapping[str, str], variable: str, default: float) -> float:
    """A non-negative finite number from *environ*, or *default* when unset or unusable."""
    try:
        value = float(environ.get(variable) or default)
    except ValueError:
        return default
    return value if math.isfinite(value) and value >= 0 else default


def _intact(st: os.stat_result, size: int | None) -> bool:
    """Whether a blob is as it was downloaded: a regular file, its mtime and size unmoved."""
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_mtime_ns == PRISTINE_MTIME_NS
        and (size is None or st.st_size == size)
    )


def _touch(path: Path) -> None:
    """Record a use (atime = now) and keep the sentinel mtime."""
    try:
        os.utime(path, ns=(time.time_ns(), PRISTINE_MTIME_NS))
    except OSError as exc:  # not ours to change: the blob still serves
        logger.debug("mount cache: could not mark %s used: %s", path.name[:12], exc)


def _link_or_copy(source: Path, dest: Path) -> None:
    """Hard-link *source* at *dest*; copy it (read-only) where links cannot be made."""
    dest.unlink(missing_ok=True)
    try:
        os.link(source, dest)
    except FileNotFoundError:
        raise
    except OSError:  # another filesystem, or one without hard links
        shutil.copyfile(source, dest)
        dest.chmod(0o444)


def _mkdir_private(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def _blob_paths(blobs: Path) -> Iterable[Path]:
    """Every blob and in-flight download under *blobs*."""
    if not blobs.is_dir():
        return
    for entry in blobs.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            yield from entry.iterdir()
        elif entry.name.startswith(".tmp-"):
            yield entry
