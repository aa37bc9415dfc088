"""Where one environment's pieces live under the root: :class:`EnvironmentPaths`.

The first four are Strata's reference worker's layout, so both workers share a root::

    <root>/<dir key>/                       the environment (a uv venv)
    <root>/<dir key>/.strata-env-complete   written last: the environment may be trusted
    <root>/<dir key>.project/               pyproject.toml + uv.lock that built it
    <root>/<dir key>.lock                   the cross-process build lock (flock)

and the rest are this worker's own, next to it, never inside the user's environment's
packages::

    <root>/<dir key>.used                   its mtime: when a cell last asked for it
    <root>/<dir key>.kernel-overlay/        what a kernel needs there (see overlay.py)
    <root>/<dir key>.kernel-overlay.lock    the overlay's build lock
    <root>/.<dir key>.*.tmp-*/              scratch of a fetch or an overlay build in flight

The directory key is the first 32 hex digits of ``sha256("<lock key>\\n<interpreter build>")``:
one environment per lock and interpreter build.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["COMPLETE_MARKER", "EnvironmentPaths", "directory_key", "is_directory_key"]

COMPLETE_MARKER = ".strata-env-complete"
OVERLAY_MARKER = ".kernel-overlay-complete"
_DIRECTORY_KEY = re.compile(r"[0-9a-f]{32}")


def directory_key(lock_key: str, build: str) -> str:
    """The directory an environment of *lock_key* built by the interpreter *build* lives in."""
    return hashlib.sha256(f"{lock_key}\n{build}".encode()).hexdigest()[:32]


def is_directory_key(name: str) -> bool:
    return _DIRECTORY_KEY.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class EnvironmentPaths:
    """The paths of the environment *key* under *root*."""

    root: Path
    key: str  # the directory key

    @property
    def env(self) -> Path:
        return self.root / self.key

    @property
    def python(self) -> Path:
        return self.env / "bin" / "python"

    @property
    def marker(self) -> Path:
        return self.env / COMPLETE_MARKER

    @property
    def project(self) -> Path:
        return self.root / f"{self.key}.project"

    @property
    def lock(self) -> Path:
        return self.root / f"{self.key}.lock"

    @property
    def used(self) -> Path:
        return self.root / f"{self.key}.used"

    @property
    def overlay(self) -> Path:
        return self.root / f"{self.key}.kernel-overlay"

    @property
    def overlay_marker(self) -> Path:
        return self.overlay / OVERLAY_MARKER

    @property
    def overlay_lock(self) -> Path:
        return self.root / f"{self.key}.kernel-overlay.lock"

    def scratch_prefix(self, purpose: str) -> str:
        """A ``tempfile.mkdtemp`` prefix for scratch of *purpose* ("fetch", "overlay")."""
        return f".{self.key}.{purpose}.tmp-"
