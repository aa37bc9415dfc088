"""Running uv, and asking it which interpreter builds an environment.

Every uv call goes through :func:`run_uv`: no ``VIRTUAL_ENV`` of the worker's own leaks in,
uv never downloads a Python (the interpreter must already be on this machine), and a
failure or a timeout becomes an :class:`~.errors.EnvironmentBuildError` here, the one place
``subprocess`` errors are translated.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import EnvironmentBuildError

__all__ = ["Interpreter", "find_interpreter", "probe_build", "probe_uv", "run_uv"]

log = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 60.0
# One line, "<implementation>-<version><abiflags> <platform>": "cpython-3.12.1 linux-x86_64".
# Strata's reference worker names an interpreter build the same way, so both workers compute
# the same directory key and registry address for it.
_BUILD_PROBE = (
    "import platform, sys, sysconfig\n"
    "tag = sys.implementation.name + '-' + platform.python_version() + sys.abiflags\n"
    "print(tag, sysconfig.get_platform())\n"
)
_MINOR = re.compile(r"-(\d+)\.(\d+)\.")


@dataclass(frozen=True, slots=True)
class Interpreter:
    """A Python on this machine that uv builds environments with."""

    path: Path  # the interpreter itself, as ``uv python find`` names it
    build: str  # "cpython-3.12.1 linux-x86_64"

    @property
    def version(self) -> str:
        """Its major.minor, "3.12"."""
        found = _MINOR.search(self.build)
        return f"{found[1]}.{found[2]}" if found else ""


def probe_uv() -> str | None:
    """The uv this worker builds environments with, or None when none works.

    uv on ``PATH`` first, else the one the ``uv`` Python package ships; it must answer
    ``uv --version``. Blocking: call it once, at start.
    """
    candidates = [shutil.which("uv")]
    try:
        from uv import find_uv_bin

        candidates.append(find_uv_bin())
    except (ImportError, FileNotFoundError):
        pass
    for candidate in candidates:
        if candidate and _answers(candidate):
            return candidate
    return None


def _answers(uv: str) -> bool:
    try:
        done = subprocess.run(
            [uv, "--version"], capture_output=True, timeout=PROBE_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def uv_environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment uv runs with: the worker's, less its venv, never downloading Pythons."""
    environ = {name: value for name, value in os.environ.items() if name != "VIRTUAL_ENV"}
    environ["UV_PYTHON_DOWNLOADS"] = "never"
    environ.update(extra or {})
    return environ


class _CommandFailed(Exception):
    """A command exited non-zero (``detail``: its output) or ran out of time (``timeout``)."""

    def __init__(self, detail: str, timeout: float | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.timeout = timeout


def _completed(
    argv: Sequence[str],
    *,
    timeout_seconds: float,
    cwd: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv,
            cwd=cwd,
            env=uv_environ(extra_env),
            capture_output=True,
            text=True,
            check=True,
            timeout=timeout_seconds,
        )
    except subprocess.CalledProcessError as exc:
        raise _CommandFailed((exc.stderr or exc.stdout or "").strip()) from exc
    except subprocess.TimeoutExpired as exc:
        raise _CommandFailed("timed out", timeout=exc.timeout) from exc
    except OSError as exc:
        raise _CommandFailed(f"could not start: {exc}") from exc


def run_uv(
    uv: str,
    args: Sequence[str],
    *,
    what: str,
    timeout_seconds: float,
    cwd: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``uv *args``; *what* names the step in the error ("uv sync failed ...")."""
    try:
        return _completed(
            [uv, *args], timeout_seconds=timeout_seconds, cwd=cwd, extra_env=extra_env
        )
    except _CommandFailed as exc:
        if exc.timeout is not None:
            raise EnvironmentBuildError(
                f"{what} on this worker timed out after {exc.timeout:g}s"
            ) from exc
        raise EnvironmentBuildError(f"{what} failed on this worker: {exc.detail}") from exc


def find_interpreter(uv: str, python: str) -> Interpreter:
    """The interpreter uv picks for the request *python* ("" for its first), and its build."""
    args = [uv, "python", "find", "--system", *([python] if python else [])]
    try:
        found = _completed(args, timeout_seconds=PROBE_TIMEOUT_SECONDS)
        path = Path(found.stdout.strip())
        build = _completed([str(path), "-c", _BUILD_PROBE], timeout_seconds=PROBE_TIMEOUT_SECONDS)
    except _CommandFailed as exc:
        if exc.timeout is not None:
            raise EnvironmentBuildError(
                f"finding Python {python} on this worker timed out after {exc.timeout:g}s"
            ) from exc
        raise EnvironmentBuildError(f"no Python {python} on this worker: {exc.detail}") from exc
    return Interpreter(path=path, build=build.stdout.strip())


def probe_build(python: Path) -> str | None:
    """The build line of the interpreter *python*, or None when it does not run."""
    try:
        done = _completed([str(python), "-c", _BUILD_PROBE], timeout_seconds=PROBE_TIMEOUT_SECONDS)
    except _CommandFailed:
        return None
    return done.stdout.strip()
