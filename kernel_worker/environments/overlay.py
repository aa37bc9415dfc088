"""Kernel overlays: what a Jupyter kernel needs in an environment, beside it, not in it.

The user's environment holds exactly what the lock says; a kernel also needs ipykernel and
the packages the worker's in-kernel code uses. Those are resolved for the environment's
interpreter build and installed (``uv pip install --target --no-deps``, bytecode compiled)
into ``<root>/kernel-overlays/<overlay key>/``, the key being the build and the resolved
set: environments that resolve to the same set share one overlay. A kernel puts the
overlay at the *end* of ``sys.path``: the lock's packages win wherever both hold one.

Which set, for an environment::

    pins = the environment's distributions (its site-packages)
    free = the build's resolution with no pins (once per build and process)
    every pin on a distribution of free is free's version ... free: the build's SHARED overlay
    otherwise ................. resolved with every pin as a constraint: an overlay of its own

so an overlay never contradicts a pin. The overlay is built in scratch and renamed into
place with its marker inside, under its own flock (``kernel-overlays/<key>.lock``); the
environment's ``<dir key>.kernel-overlay-key`` names it, written under that lock, so
eviction (``disk.py``) sees every user of an overlay. When no ipykernel can run with the
lock's pins, :func:`ensure` names the pins that stand in the way.

Blocking: call these from a thread.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import locking
from .errors import EnvironmentBuildError
from .layout import EnvironmentPaths, OverlayPaths, is_directory_key, overlay_key
from .uv import run_uv

__all__ = ["KERNEL_REQUIREMENTS", "KernelOverlay", "ensure", "ensure_shared", "free_resolution"]

KERNEL_REQUIREMENTS = ("ipykernel>=6.29", "pyzmq", "cloudpickle", "pyarrow")
_LIST_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True, slots=True)
class KernelOverlay:
    """A complete overlay: its marker is written."""

    key: str
    path: Path
    requirements: tuple[str, ...]  # its resolved set, ``name==version``
    shared: bool  # the build's resolution with no pins: any environment not pinning it


@dataclass(frozen=True, slots=True)
class Installer:
    """How overlays are installed here (the store's settings); *use* is called with each
    overlay handed out, under its build lock, to mark it used (its ``users`` lock)."""

    uv: str
    allow_source_builds: bool
    source_build_hint: str
    timeout_seconds: float
    use: Callable[[OverlayPaths], None]

    @property
    def no_build(self) -> list[str]:
        return [] if self.allow_source_builds else ["--no-build"]


def free_resolution(installer: Installer, python: Path) -> tuple[str, ...]:
    """The kernel's packages resolved for the interpreter *python*, nothing pinned."""
    with tempfile.TemporaryDirectory(prefix="kernel-overlay-") as scratch:
        chosen = _compile(installer, python, Path(scratch), constraints=None)
    return _requirements(chosen)


def ensure(
    installer: Installer, paths: EnvironmentPaths, build: str, free: tuple[str, ...]
) -> KernelOverlay:
    """The overlay of the complete environment at *paths*, built if missing."""
    if not paths.marker.exists():
        raise EnvironmentBuildError(f"environment {paths.key} is not built on this worker")
    pins = _installed(installer.uv, paths)
    known = _named(installer, paths, pins, overlay_key(build, free))
    if known is not None:  # chosen before (by any worker): nothing resolved again
        return known
    if _agree(pins, free):
        overlay = _materialised(installer, paths.root, paths.python, build, free, None, paths)
        if _agree(pins, overlay.requirements):  # (what it holds, should the index have moved)
            return overlay
    resolved = _constrained(installer, paths, pins)
    overlay = _materialised(installer, paths.root, paths.python, build, resolved, pins, paths)
    return overlay


def _named(
    installer: Installer, paths: EnvironmentPaths, pins: Mapping[str, str], shared_key: str
) -> KernelOverlay | None:
    """The overlay the environment's note names, if complete and still agreeing."""
    try:
        key = paths.overlay_ref.read_text().strip()
    except OSError:
        return None
    if not is_directory_key(key):
        return None
    overlay = OverlayPaths(paths.root, key)
    with locking.held(overlay.lock, timeout_seconds=installer.timeout_seconds):
        if not overlay.marker.exists():
            return None
        held = tuple(overlay.requirements.read_text().split())
        if not _agree(pins, held):
            return None
        installer.use(overlay)
    return KernelOverlay(key, overlay.path, held, shared=key == shared_key)


def ensure_shared(
    installer: Installer, root: Path, python: Path, build: str, free: tuple[str, ...]
) -> KernelOverlay:
    """The build's shared overlay, made ahead of any environment (a warm-up)."""
    root.mkdir(parents=True, exist_ok=True)
    return _materialised(installer, root, python, build, free, None, None)


def _materialised(
    installer: Installer,
    root: Path,
    python: Path,
    build: str,
    resolved: tuple[str, ...],
    pins: Mapping[str, str] | None,
    user: EnvironmentPaths | None,
) -> KernelOverlay:
    """The overlay of *resolved* (resolved under *pins*; ``None``: the build's shared one),
    installed unless complete; *user* noted as its user."""
    paths = OverlayPaths(root, overlay_key(build, resolved))
    paths.folder.mkdir(parents=True, exist_ok=True)
    try:
        with locking.held(paths.lock, timeout_seconds=installer.timeout_seconds):
            if not paths.marker.exists():
                _install(installer, python, paths, resolved, pins)
            installer.use(paths)
            if user is not None:  # under the lock: eviction never misses a new user
                user.overlay_ref.write_text(paths.key)
            held = tuple(paths.requirements.read_text().split())
    except OSError as exc:
        raise EnvironmentBuildError(
            f"the kernel overlay {paths.key} could not be made: {exc.strerror or exc}"
        ) from exc
    return KernelOverlay(paths.key, paths.path, held, shared=pins is None)


def _install(
    installer: Installer,
    python: Path,
    paths: OverlayPaths,
    resolved: tuple[str, ...],
    pins: Mapping[str, str] | None,
) -> None:
    scratch = Path(tempfile.mkdtemp(dir=paths.folder, prefix=paths.scratch_prefix))
    try:
        requirements = scratch / "requirements.txt"
        requirements.write_text("".join(f"{line}\n" for line in resolved))
        target = scratch / "overlay"
        args = ["pip", "install", "--target", str(target), "--python", str(python)]
        args += ["--compile-bytecode", *installer.no_build]
        try:
            run_uv(
                installer.uv, [*args, "--no-deps", "-r", str(requirements)],
                what="installing the kernel's packages",
                timeout_seconds=installer.timeout_seconds,
            )  # fmt: skip
        except EnvironmentBuildError:
            # the index answered otherwise than when it was resolved (a release just out,
            # or withdrawn): resolved again as it is installed, under the same pins
            shutil.rmtree(target, ignore_errors=True)
            constraints = scratch / "constraints.txt"
            constraints.write_text("".join(f"{n}=={v}\n" for n, v in (pins or {}).items()))
            run_uv(
                installer.uv, [*args, "-c", str(constraints), *KERNEL_REQUIREMENTS],
                what="installing the kernel's packages",
                timeout_seconds=installer.timeout_seconds,
            )  # fmt: skip
        held = _requirements(_dist_infos(target))  # what it holds, as installed
        (target / paths.requirements.name).write_text("".join(f"{line}\n" for line in held))
        (target / paths.marker.name).touch()
        shutil.rmtree(paths.path, ignore_errors=True)  # an incomplete one's leftovers
        target.rename(paths.path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _constrained(
    installer: Installer, paths: EnvironmentPaths, pins: Mapping[str, str]
) -> tuple[str, ...]:
    """The kernel's packages resolved against every pin of the environment."""
    with tempfile.TemporaryDirectory(prefix="kernel-overlay-") as name:
        scratch = Path(name)
        try:
            chosen = _compile(installer, paths.python, scratch, constraints=pins)
        except EnvironmentBuildError as exc:
            raise _explained(installer, paths.python, pins, scratch, exc) from exc
    return _requirements(chosen)


def _installed(uv: str, paths: EnvironmentPaths) -> dict[str, str]:
    """Every distribution in the environment: normalised name -> version.

    Read from its site-packages' ``*.dist-info`` folders (named ``<name>-<version>``); a
    version written differently there than a resolver writes it only costs sharing."""
    found = {}
    for site_packages in paths.env.glob("lib/python*/site-packages"):
        found.update(_dist_infos(site_packages))
    return found or _listed(uv, paths.python)


def _dist_infos(folder: Path) -> dict[str, str]:
    """The distributions installed in *folder*: normalised name -> version."""
    found = {}
    for info in folder.glob("*.dist-info"):
        name, _, version = info.name.removesuffix(".dist-info").rpartition("-")
        if name and version:
            found[_normalised(name)] = version
    return found


def _agree(pins: Mapping[str, str], requirements: Sequence[str]) -> bool:
    """Whether *requirements* holds none of the pinned distributions at another version."""
    held = _parsed(requirements)
    return all(pins.get(name, version) == version for name, version in held.items())


def _listed(uv: str, python: Path) -> dict[str, str]:
    """Every distribution in the environment of *python*, as ``uv pip list`` sees them."""
    listed = run_uv(
        uv,
        ["pip", "list", "--python", str(python), "--format", "json"],
        what="listing the environment's packages",
        timeout_seconds=_LIST_TIMEOUT_SECONDS,
    )
    try:
        entries = json.loads(listed.stdout)
        return {_normalised(entry["name"]): str(entry["version"]) for entry in entries}
    except (ValueError, TypeError, KeyError) as exc:
        raise EnvironmentBuildError(f"uv pip list answered something unreadable: {exc}") from exc


def _explained(
    installer: Installer,
    python: Path,
    pins: Mapping[str, str],
    scratch: Path,
    cause: EnvironmentBuildError,
) -> EnvironmentBuildError:
    """Why the overlay failed: the pins it cannot run with, found one at a time."""
    free = _resolution(installer, python, scratch, constraints=None)
    if free is None:  # not the lock's doing: no network, no wheel for this platform...
        return EnvironmentBuildError(f"the kernel's packages cannot be installed here: {cause}")
    suspects = {n: v for n, v in sorted(pins.items()) if n in free and free[n] != v}
    blocking = [
        f"{name}=={version}"
        for name, version in suspects.items()
        if _resolution(installer, python, scratch, constraints={name: version}) is None
    ]
    if blocking:
        return EnvironmentBuildError(
            f"the lock pins {', '.join(blocking)}, which the kernel cannot run with: {cause}"
        )
    return EnvironmentBuildError(
        f"the lock's pins together leave no ipykernel the kernel can run with: {cause}"
    )


def _resolution(
    installer: Installer, python: Path, scratch: Path, *, constraints: Mapping[str, str] | None
) -> dict[str, str] | None:
    try:
        return _compile(installer, python, scratch, constraints=constraints)
    except EnvironmentBuildError:
        return None


def _compile(
    installer: Installer, python: Path, scratch: Path, *, constraints: Mapping[str, str] | None
) -> dict[str, str]:
    """What the kernel's packages resolve to for *python* under *constraints*."""
    requirements = scratch / "kernel.in"
    requirements.write_text("".join(f"{line}\n" for line in KERNEL_REQUIREMENTS))
    args = ["pip", "compile", str(requirements), "--python", str(python), "--quiet"]
    args += ["--no-header", "--no-annotate", *installer.no_build]
    if constraints is not None:
        pinned = scratch / "constraints.txt"
        pinned.write_text("".join(f"{n}=={v}\n" for n, v in constraints.items()))
        args += ["-c", str(pinned)]
    compiled = run_uv(
        installer.uv, args, what="resolving the kernel's packages",
        timeout_seconds=_LIST_TIMEOUT_SECONDS,
    )  # fmt: skip
    chosen = (line.split("==", 1) for line in compiled.stdout.splitlines() if "==" in line)
    return {_normalised(name): version.split()[0] for name, version in chosen if version.strip()}


def _requirements(chosen: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(sorted(f"{name}=={version}" for name, version in chosen.items()))


def _parsed(requirements: Sequence[str]) -> dict[str, str]:
    return {name: version for name, _, version in (r.partition("==") for r in requirements)}


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
