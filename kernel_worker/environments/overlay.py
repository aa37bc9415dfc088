"""A kernel overlay: what a Jupyter kernel needs in an environment, beside it, not in it.

The user's environment holds exactly what the lock says; a kernel also needs ipykernel and
the packages the worker's in-kernel code uses. Those go into ``<root>/<dir key>.kernel-overlay``
with ``uv pip install --target``, resolved for the environment's interpreter and constrained
to every version the environment already has, so the overlay never contradicts a pin. A
kernel puts the overlay at the *end* of ``sys.path``: the lock's packages win wherever both
hold one.

The overlay is built in scratch and renamed into place with its marker inside, under its own
flock (``<dir key>.kernel-overlay.lock``). When no ipykernel can run with the lock's pins,
:func:`ensure` names the pins that stand in the way.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from . import locking
from .errors import EnvironmentBuildError
from .layout import OVERLAY_MARKER, EnvironmentPaths
from .uv import run_uv

__all__ = ["KERNEL_REQUIREMENTS", "ensure"]

KERNEL_REQUIREMENTS = ("ipykernel>=6.29", "pyzmq", "cloudpickle", "pyarrow")
_LIST_TIMEOUT_SECONDS = 120.0


def ensure(
    uv: str,
    paths: EnvironmentPaths,
    *,
    allow_source_builds: bool,
    source_build_hint: str,
    timeout_seconds: float,
) -> Path:
    """The overlay of the complete environment at *paths*, built if missing. Blocking."""
    if paths.overlay_marker.exists():
        return paths.overlay
    with locking.held(paths.overlay_lock, timeout_seconds=timeout_seconds):
        if paths.overlay_marker.exists():
            return paths.overlay
        if not paths.marker.exists():
            raise EnvironmentBuildError(f"environment {paths.key} is not built on this worker")
        scratch = Path(tempfile.mkdtemp(dir=paths.root, prefix=paths.scratch_prefix("overlay")))
        try:
            _build(uv, paths, scratch, allow_source_builds, source_build_hint, timeout_seconds)
        except OSError as exc:
            raise EnvironmentBuildError(
                f"the kernel overlay of environment {paths.key} could not be made: "
                f"{exc.strerror or exc}"
            ) from exc
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return paths.overlay


def _build(
    uv: str,
    paths: EnvironmentPaths,
    scratch: Path,
    allow_source_builds: bool,
    hint: str,
    timeout_seconds: float,
) -> None:
    pins = _installed(uv, paths.python)
    constraints = scratch / "constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in pins.items()))
    target = scratch / "overlay"
    no_build = [] if allow_source_builds else ["--no-build"]
    args = ["pip", "install", "--target", str(target), "--python", str(paths.python)]
    try:
        run_uv(
            uv,
            [*args, "-c", str(constraints), *no_build, *KERNEL_REQUIREMENTS],
            what="installing the kernel's packages",
            timeout_seconds=timeout_seconds,
        )
    except EnvironmentBuildError as exc:
        raise _explained(uv, paths.python, pins, scratch, no_build, exc) from exc
    (target / OVERLAY_MARKER).touch()
    shutil.rmtree(paths.overlay, ignore_errors=True)
    target.rename(paths.overlay)


def _installed(uv: str, python: Path) -> dict[str, str]:
    """Every distribution in the environment of *python*: normalised name -> version."""
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
    uv: str,
    python: Path,
    pins: dict[str, str],
    scratch: Path,
    no_build: Sequence[str],
    cause: EnvironmentBuildError,
) -> EnvironmentBuildError:
    """Why the overlay failed: the pins it cannot run with, found one at a time."""
    free = _resolution(uv, python, scratch, no_build, constraint=None)
    if free is None:  # not the lock's doing: no network, no wheel for this platform...
        return EnvironmentBuildError(f"the kernel's packages cannot be installed here: {cause}")
    suspects = [f"{n}=={v}" for n, v in sorted(pins.items()) if n in free and free[n] != v]
    blocking = [
        pin
        for pin in suspects
        if _resolution(uv, python, scratch, no_build, constraint=pin) is None
    ]
    if blocking:
        return EnvironmentBuildError(
            f"the lock pins {', '.join(blocking)}, which the kernel cannot run with: {cause}"
        )
    return EnvironmentBuildError(
        f"the lock's pins together leave no ipykernel the kernel can run with: {cause}"
    )


def _resolution(
    uv: str, python: Path, scratch: Path, no_build: Sequence[str], *, constraint: str | None
) -> dict[str, str] | None:
    """What the kernel's packages resolve to for *python*, with at most one pin; None: nothing."""
    requirements = scratch / "kernel.in"
    requirements.write_text("".join(f"{line}\n" for line in KERNEL_REQUIREMENTS))
    args = ["pip", "compile", str(requirements), "--python", str(python), "--quiet"]
    args += ["--no-header", "--no-annotate", *no_build]
    if constraint is not None:
        pinned = scratch / "one-pin.txt"
        pinned.write_text(constraint + "\n")
        args += ["-c", str(pinned)]
    try:
        compiled = run_uv(uv, args, what="uv pip compile", timeout_seconds=_LIST_TIMEOUT_SECONDS)
    except EnvironmentBuildError:
        return None
    chosen = (line.split("==", 1) for line in compiled.stdout.splitlines() if "==" in line)
    return {_normalised(name): version.split()[0] for name, version in chosen if version.strip()}


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
