"""What the environments take on disk, and opt-in eviction by last use.

Each call of ``ensure`` touches ``<dir key>.used``; an environment's last use is that file's
mtime, or its marker's for one that only a reference worker has used. Eviction removes
whole environments (venv, project, the note of their kernel overlay), least recently used
first, under their locks: one another process holds (building, or building its overlay) is
skipped, as is any in ``keep``. The marker goes first, so a half-removed environment is
never trusted.

Kernel overlays are shared (``overlay.py``): one is removed only when no complete
environment on disk names it, no process holds its ``users`` lock (a live pool or a fork
template of any worker on the host), and nobody is building it.

Blocking: call these from a thread.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from . import locking
from .layout import COMPLETE_MARKER, EnvironmentPaths, OverlayPaths, is_directory_key

__all__ = ["EnvironmentUsage", "evict", "sweep_overlays", "usage"]


@dataclass(frozen=True, slots=True)
class EnvironmentUsage:
    """One complete environment under the root."""

    dir_key: str
    path: Path  # the venv
    bytes: int  # venv, project and kernel overlay together
    last_used_at: float  # seconds since the epoch (file mtimes)


def usage(root: Path) -> list[EnvironmentUsage]:
    """Every complete environment under *root*, least recently used first."""
    try:
        names = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        paths = EnvironmentPaths(root, name)
        last_used = _last_used(paths) if is_directory_key(name) else None
        if last_used is not None:
            size = sum(_size(p) for p in (paths.env, paths.project, paths.overlay))
            found.append(EnvironmentUsage(name, paths.env, size, last_used))
    return sorted(found, key=lambda entry: entry.last_used_at)


def evict(
    root: Path,
    *,
    max_bytes: int | None,
    max_idle_seconds: float | None,
    keep: frozenset[str],
) -> list[str]:
    """Remove the idle, then the least recently used past *max_bytes*; the keys removed."""
    entries = usage(root)
    total = sum(entry.bytes for entry in entries)
    now = time.time()
    removed = []
    for entry in entries:
        if entry.dir_key in keep:
            continue
        idle = max_idle_seconds is not None and now - entry.last_used_at > max_idle_seconds
        over = max_bytes is not None and total > max_bytes
        if (idle or over) and _remove(EnvironmentPaths(root, entry.dir_key), entry.last_used_at):
            removed.append(entry.dir_key)
            total -= entry.bytes
    return removed


def sweep_overlays(root: Path) -> list[str]:
    """Remove the kernel overlays nothing uses any more; the keys removed."""
    folder = OverlayPaths(root, "").folder
    try:
        keys = sorted(e.name for e in os.scandir(folder) if e.is_dir() and is_directory_key(e.name))
    except FileNotFoundError:
        return []
    removed = []
    for key in set(keys) - _overlays_named(root):
        paths = OverlayPaths(root, key)
        with locking.try_held(paths.lock) as unbuilt, locking.try_held(paths.users) as unused:
            if not (unbuilt and unused) or key in _overlays_named(root):
                continue
            paths.marker.unlink(missing_ok=True)
            shutil.rmtree(paths.path, ignore_errors=True)
            removed.append(key)
    return removed


def _overlays_named(root: Path) -> set[str]:
    """The overlays complete environments under *root* use."""
    named = set()
    for ref in root.glob("*.kernel-overlay-key"):
        env = root / ref.name.removesuffix(".kernel-overlay-key")
        with contextlib.suppress(OSError):
            if (env / COMPLETE_MARKER).exists():
                named.add(ref.read_text().strip())
    return named


def _remove(paths: EnvironmentPaths, seen_used_at: float) -> bool:
    with (
        locking.try_held(paths.lock) as env_free,
        locking.try_held(paths.overlay_lock) as overlay_free,
    ):
        if not (env_free and overlay_free):
            return False
        if (_last_used(paths) or 0.0) > seen_used_at:
            return False  # used since we looked
        paths.marker.unlink(missing_ok=True)
        for directory in (paths.env, paths.project, paths.overlay):
            shutil.rmtree(directory, ignore_errors=True)
        paths.used.unlink(missing_ok=True)
        paths.overlay_ref.unlink(missing_ok=True)
    return True


def _last_used(paths: EnvironmentPaths) -> float | None:
    """When the complete environment at *paths* was last used; None if it is not complete."""
    try:
        marked = paths.marker.stat().st_mtime
    except FileNotFoundError:
        return None
    try:
        return paths.used.stat().st_mtime
    except FileNotFoundError:
        return marked  # only ever used by a worker that does not record it


def _size(top: Path) -> int:
    """Bytes of the files under *top*, links not followed."""
    total = 0
    for directory, _, files in os.walk(top):
        for name in files:
            with contextlib.suppress(OSError):  # removed while we walk
                total += os.lstat(os.path.join(directory, name)).st_size
    return total
