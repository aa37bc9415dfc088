"""Fetching a prebuilt environment from ``STRATA_WORKER_ENV_REGISTRY_URL``.

An environment is published as a ``.tar.gz`` of the venv's contents at
``<registry>/<lock key>/<implementation-version>/<platform>``, for instance
``https://envs.example/3f…a9/cpython-3.12.1/linux-x86_64``: the address Strata's reference
worker asks for. A registry is a cache, never the only way: :func:`fetch` says
:attr:`FetchOutcome.MISSING` or :attr:`FetchOutcome.UNUSABLE` instead of failing, and the
store then builds the environment itself.

An archive made from a uv venv holds ``bin/python`` as an absolute link to the interpreter
of the machine that built it. The link is re-pointed at this machine's interpreter of the
same build (and ``pyvenv.cfg``'s ``home`` with it); any other link leaving the archive makes
it unusable. The unpacked environment must then run and report the expected build before
it replaces anything.
"""

from __future__ import annotations

import enum
import logging
import posixpath
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

import httpx

from .layout import EnvironmentPaths
from .uv import Interpreter, probe_build

__all__ = ["FetchOutcome", "archive_url", "fetch"]

log = logging.getLogger(__name__)

_CONNECT_TIMEOUT_SECONDS = 30.0
_PYTHON_LINK = re.compile(r"bin/python[0-9.]*")


class FetchOutcome(enum.Enum):
    FETCHED = "fetched"  # unpacked, checked and moved into place
    MISSING = "missing"  # the registry has no such archive (404)
    UNUSABLE = "unusable"  # unreachable, an error status, a bad archive, or it does not run


def archive_url(registry: str, lock_key: str, build: str) -> str:
    """Where *registry* keeps the environment of *lock_key* for the interpreter *build*."""
    return f"{registry.rstrip('/')}/{lock_key}/{build.replace(' ', '/')}"


def fetch(
    url: str, paths: EnvironmentPaths, interpreter: Interpreter, *, timeout_seconds: float
) -> FetchOutcome:
    """Put the archive at *url* in place as *paths*' environment, if it works here.

    Blocking; the caller holds the environment's lock. Nothing but a checked environment
    reaches ``paths.env``, and the scratch is removed whatever happens.
    """
    scratch = Path(tempfile.mkdtemp(dir=paths.root, prefix=paths.scratch_prefix("fetch")))
    try:
        archive = scratch / "environment.tar.gz"
        outcome = _download(url, archive, timeout_seconds)
        if outcome is not FetchOutcome.FETCHED:
            return outcome
        unpacked = scratch / "environment"
        if not _unpack(archive, unpacked, interpreter):
            log.warning("registry archive unusable: cannot unpack; url=%s", url)
            return FetchOutcome.UNUSABLE
        if probe_build(unpacked / "bin" / "python") != interpreter.build:
            log.warning("registry archive unusable: its python does not run here; url=%s", url)
            return FetchOutcome.UNUSABLE
        shutil.rmtree(paths.env, ignore_errors=True)
        unpacked.rename(paths.env)
        return FetchOutcome.FETCHED
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _download(url: str, archive: Path, timeout_seconds: float) -> FetchOutcome:
    timeout = httpx.Timeout(timeout_seconds, connect=_CONNECT_TIMEOUT_SECONDS)
    try:
        with httpx.stream("GET", url, timeout=timeout, follow_redirects=True) as response:
            if response.status_code == 404:
                return FetchOutcome.MISSING
            if response.status_code != 200:
                log.warning("registry answered %d; url=%s", response.status_code, url)
                return FetchOutcome.UNUSABLE
            with archive.open("wb") as out:
                for chunk in response.iter_bytes():
                    out.write(chunk)
    except httpx.HTTPError as exc:
        log.warning("registry unreachable: %s; url=%s", type(exc).__name__, url)
        return FetchOutcome.UNUSABLE
    return FetchOutcome.FETCHED


def _unpack(archive: Path, into: Path, interpreter: Interpreter) -> bool:
    """Unpack *archive* into *into*, its python links re-pointed at *interpreter*."""
    python_links: list[str] = []

    def admitted(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        name = posixpath.normpath(member.name)
        if member.issym() and member.linkname.startswith("/") and _PYTHON_LINK.fullmatch(name):
            python_links.append(name)
            return None
        return tarfile.data_filter(member, dest)

    try:
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter=admitted)
        for name in python_links:
            link = into / name
            link.unlink(missing_ok=True)
            link.symlink_to(interpreter.path)
        if python_links:
            _rehome(into / "pyvenv.cfg", interpreter.path.parent)
    except (tarfile.TarError, OSError) as exc:
        log.warning("cannot unpack registry archive: %s", exc)
        return False
    return True


def _rehome(config: Path, home: Path) -> None:
    """Point the venv's ``pyvenv.cfg`` at *home*, the directory of this machine's interpreter."""
    lines = config.read_text().splitlines()
    rewritten = [
        f"home = {home}" if line.split("=")[0].strip() == "home" else line for line in lines
    ]
    config.write_text("\n".join(rewritten) + "\n")
