"""Where one environment's pieces live under the root: :class:`EnvironmentPaths`.

The first four are Strata's reference worker's layout, so both workers share a root::

    <root>/<dir key>/                       the environment (a uv venv)
    <root>/<dir key>/.strata-env-complete   written last: the environment may be trusted
    <root>/<dir key>.project/               pyproject.toml + uv.lock that built it
    <root>/<dir key>.lock                   the cross-process build lock (flock)

and the rest are this worker's own, next to it, never inside the user's environment's
packages::

    <root>/<dir key>.used                   its mtime: when a cell last asked for it
    <root>/<dir key>.kernel-overlay-key     the kernel overlay its kernels use (its key)
    <root>/.<dir key>.*.tmp-*/              scratch of a fetch in flight
    <root>/kernel-overlays/<overlay key>/   what a kernel needs (see overlay.py), shared by
                                            every environment that resolves to the same set
    <root>/kernel-overlays/<overlay key>.lock        the overlay's build lock
    <root>/kernel-overlays/<overlay key>.users       flock'd shared by each process using it
    <root>/kernel-overlays/.<overlay key>.tmp-*/     scratch of an overlay build in flight

Earlier versions kept one overlay per environment in ``<dir key>.kernel-overlay/`` (lock
``<dir key>.kernel-overlay.lock``); eviction still removes those with their environment.

The directory key is the first 32 hex digits of ``sha256("<lock key>\\n<interpreter build>")``:
one environment per lock and interpreter build. An overlay key is the same digest of
``"kernel-overlay\n<interpreter build>\n<name==version per line>"``, its resolved set.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "COMPLETE_MARKER",
    "EnvironmentPaths",
    "OverlayPaths",
    "directory_key",
    "is_directory_key",
    "overlay_key",
]

COMPLETE_MARKER = ".strata-env-complete"
OVERLAY_MARKER = ".kernel-overlay-complete"
OVERLAY_REQUIREMENTS = ".kernel-overlay-requirements.txt"
OVERLAYS_DIR = "kernel-overlays"
_DIRECTORY_KEY = re.compile(r"[0-9a-f]{32}")


def directory_key(lock_key: str, build: str) -> str:
    """The directory an environment of *lock_key* built by the interpreter *build* lives in."""
    return hashlib.sha256(f"{lock_key}\n{build}".encode()).hexdigest()[:32]


def is_directory_key(name: str) -> bool:
    return _DIRECTORY_KEY.fullmatch(name) is not None


def overlay_key(build: str, requirements: tuple[str, ...]) -> str:
    """The overlay of the resolved set *requirements* (``name==version``) for *build*."""
    text = "\n".join(["kernel-overlay", build, *sorted(requirements)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


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
    def overlay_ref(self) -> Path:
        """Holds the key of the overlay this environment's kernels use."""
        return self.root / f"{self.key}.kernel-overlay-key"

    @property
    def overlay(self) -> Path:
        """An overlay of this environment alone (earlier versions' layout)."""
        return self.root / f"{self.key}.kernel-overlay"

    @property
    def overlay_lock(self) -> Path:
        """The lock of :attr:`overlay` (earlier versions' layout)."""
        return self.root / f"{self.key}.kernel-overlay.lock"

    def scratch_prefix(self, purpose: str) -> str:
        """A ``tempfile.mkdtemp`` prefix for scratch of *purpose* ("fetch")."""
        return f".{self.key}.{purpose}.tmp-"


@dataclass(frozen=True, slots=True)
class OverlayPaths:
    """The paths of the kernel overlay *key* under *root*."""

    root: Path  # the environments' root
    key: str  # the overlay key

    @property
    def folder(self) -> Path:
        """Where every overlay lives."""
        return self.root / OVERLAYS_DIR

    @property
    def path(self) -> Path:
        return self.folder / self.key

    @property
    def marker(self) -> Path:
        return self.path / OVERLAY_MARKER

    @property
    def requirements(self) -> Path:
        return self.path / OVERLAY_REQUIREMENTS

    @property
    def lock(self) -> Path:
        return self.folder / f"{self.key}.lock"

    @property
    def users(self) -> Path:
        """Locked shared by every process whose kernels use it; eviction needs it free."""
        return self.folder / f"{self.key}.users"

    @property
    def scratch_prefix(self) -> str:
        return f".{self.key}.tmp-"
