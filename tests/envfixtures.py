"""Helpers for the locked-environment tests: real uv projects, locks, archives, a registry.

Projects are locked once per session (``uv lock`` against uv's default cache), and every
environment is built for a Python 3.12 found on this machine, never downloaded.
"""

from __future__ import annotations

import contextlib
import glob
import http.server
import os
import shutil
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kernel_worker.environments import EnvironmentSpec, lock_key, parse_environment, probe_uv

if TYPE_CHECKING:
    from tests.conftest import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
INTEROP_PYTHON = ROOT / ".venv-interop" / "bin" / "python"


def python312() -> Path | None:
    """A real Python 3.12 interpreter (pyenv's, not a shim), or None."""
    found = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12.*/bin/python3.12")))
    if found:
        return Path(found[-1])
    which = shutil.which("python3.12")
    return Path(which).resolve() if which and "shims" not in which else None


def uv_binary() -> str | None:
    return probe_uv()


@dataclass(frozen=True)
class LockedProject:
    """A uv project locked for Python 3.12: what Strata would send for it."""

    directory: Path

    @property
    def lockfile(self) -> str:
        return (self.directory / "uv.lock").read_text()

    @property
    def pyproject(self) -> str:
        return (self.directory / "pyproject.toml").read_text()

    def raw(self) -> dict[str, str]:
        return {
            "key": lock_key(self.lockfile),
            "python": "3.12",
            "lockfile": self.lockfile,
            "pyproject": self.pyproject,
        }

    def spec(self) -> EnvironmentSpec:
        spec = parse_environment(self.raw())
        assert spec is not None
        return spec


def lock_project(
    directory: Path, uv: str, python: Path, name: str, dependencies: list[str], extra: str = ""
) -> LockedProject:
    """Write a project depending on *dependencies* into *directory* and ``uv lock`` it."""
    directory.mkdir(parents=True)
    deps = ", ".join(f'"{dep}"' for dep in dependencies)
    (directory / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "0.1.0"\n'
        f'requires-python = ">=3.12,<3.13"\ndependencies = [{deps}]\n{extra}'
    )
    subprocess.run(
        [uv, "lock", "--quiet", "--python", str(python)],
        cwd=directory,
        check=True,
        capture_output=True,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
        timeout=300,
    )
    return LockedProject(directory)


def make_sdist(directory: Path, uv: str, out: Path) -> Path:
    """A tiny pure-Python package's source distribution (no wheel), in *out*."""
    package = directory / "src" / "tinypkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 42\n")
    (directory / "pyproject.toml").write_text(
        '[project]\nname = "tinypkg"\nversion = "0.1.0"\n'
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
    )
    subprocess.run(
        [uv, "build", "--sdist", "--quiet", "--out-dir", str(out)],
        cwd=directory,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (sdist,) = out.glob("tinypkg-*.tar.gz")
    return sdist


def pack_environment(env: Path, archive: Path, *, python_link: str | None = None) -> None:
    """A registry archive of the venv *env*; *python_link* replaces ``bin/python``'s target."""
    archive.parent.mkdir(parents=True, exist_ok=True)

    def retarget(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if member.name == ".strata-env-complete":
            return None
        if python_link is not None and member.name == "bin/python":
            member.linkname = python_link
        return member

    with tarfile.open(archive, "w:gz") as tar:
        for entry in sorted(env.iterdir()):
            tar.add(entry, arcname=entry.name, filter=retarget)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def registry_server(directory: Path) -> Iterator[str]:
    """Serve *directory* over HTTP on 127.0.0.1; the URL. Shut down on exit."""

    def handler(*args: object, **kwargs: object) -> _Quiet:
        return _Quiet(*args, directory=str(directory), **kwargs)  # type: ignore[arg-type]

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        assert not thread.is_alive()


def counting_uv(
    path: Path, uv: str, counter: Path, *, gate: Path | None = None, fail_first: bool = False
) -> str:
    """A uv that logs each ``sync`` to *counter*; it may wait for *gate*, or fail once.

    With *fail_first* the first sync runs to completion and then reports failure, as a
    build that dies after writing the environment would.
    """
    wait = f'while [ ! -e "{gate}" ]; do sleep 0.05; done\n' if gate else ""
    fail = (
        f'if [ ! -e "{counter}.failed" ]; then touch "{counter}.failed"; "{uv}" "$@"; exit 1; fi\n'
        if fail_first
        else ""
    )
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = sync ]; then\n'
        f'  echo "$$" >> "{counter}"\n'
        f"  {wait}"
        f"  {fail}"
        "fi\n"
        f'exec "{uv}" "$@"\n'
    )
    path.chmod(0o755)
    return str(path)


# --- fixtures: a test module imports the *_fixture functions to use them ---


@dataclass(frozen=True)
class Projects:
    """The session's locked projects."""

    basic: LockedProject  # six==1.16.0 and idna
    other: LockedProject  # six==1.17.0 alone: another package set, another version
    sdist: LockedProject  # tinypkg, an sdist with no wheel, plus six
    old_traitlets: LockedProject  # traitlets==5.9.0: older than the kernel would pick, usable
    ancient_traitlets: LockedProject  # traitlets==4.3.3: no ipykernel >= 6.29 runs with it


@pytest.fixture(name="uv", scope="session")
def uv_fixture() -> str:
    found = uv_binary()
    if found is None:
        pytest.skip("no working uv")
    return found


@pytest.fixture(name="py312", scope="session")
def py312_fixture() -> Path:
    found = python312()
    if found is None:
        pytest.skip("no Python 3.12 on this machine")
    return found


@pytest.fixture(name="on_path")
def on_path_fixture(py312: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Python 3.12's real bin directory first on PATH, where ``uv python find`` looks."""
    monkeypatch.setenv("PATH", f"{py312.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return py312


@pytest.fixture(name="projects", scope="session")
def projects_fixture(tmp_path_factory: pytest.TempPathFactory, uv: str, py312: Path) -> Projects:
    base = tmp_path_factory.mktemp("projects")
    sdists = base / "sdists"
    make_sdist(base / "tinypkg", uv, sdists)
    find_links = f'[tool.uv]\nfind-links = ["{sdists}"]\n'
    return Projects(
        basic=lock_project(base / "basic", uv, py312, "basic", ["six==1.16.0", "idna"]),
        other=lock_project(base / "other", uv, py312, "other", ["six==1.17.0"]),
        sdist=lock_project(base / "sdist", uv, py312, "withsdist", ["tinypkg", "six"], find_links),
        old_traitlets=lock_project(base / "old", uv, py312, "old", ["traitlets==5.9.0"]),
        ancient_traitlets=lock_project(
            base / "ancient", uv, py312, "ancient", ["traitlets==4.3.3"]
        ),
    )


def run_python(python: Path, code: str, *, path_tail: Path | None = None) -> str:
    """Run *code* with *python*; *path_tail* goes at the end of ``sys.path``. Its stdout."""
    prelude = f"import sys; sys.path.append({str(path_tail)!r})\n" if path_tail else ""
    done = subprocess.run(
        [str(python), "-c", prelude + code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@dataclass(frozen=True)
class GatedBuild:
    """A worker whose environment builds wait at a gate: a cell for :attr:`project` stays
    in its build until :attr:`gate` exists; :attr:`counter` has a line per ``uv sync``."""

    worker: WorkerProcess
    project: LockedProject
    gate: Path
    counter: Path


@contextlib.contextmanager
def gated_build_worker(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, uv: str, py312: Path, name: str
) -> Iterator[GatedBuild]:
    """A one-kernel worker (``--queue-wait 1``) whose ``uv sync`` waits for a gate, and a
    project (``idna==3.7``) to build; the gate opens and the worker stops on exit."""
    from tests.conftest import start_worker

    project = lock_project(tmp_path / "p", uv, py312, name, ["idna==3.7"])
    tools = tmp_path / "bin"
    tools.mkdir()
    gate, counter = tmp_path / "gate", tmp_path / "syncs"
    counting_uv(tools / "uv", uv, counter, gate=gate)
    path = os.pathsep.join([str(tools), str(py312.parent), os.environ.get("PATH", "")])
    worker = start_worker(
        tmp_path_factory, "--pool-size", "1", "--env-root", str(tmp_path / "envs"),
        "--queue-wait", "1", env={"PATH": path},
    )  # fmt: skip
    try:
        yield GatedBuild(worker, project, gate, counter)
    finally:
        gate.touch()
        worker.stop()
