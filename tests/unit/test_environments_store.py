"""Building locked environments with real uv: reuse, races, failures, sources, the registry."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import psutil
import pytest

from kernel_worker.environments import (
    EnvironmentBuildError,
    EnvironmentOrigin,
    EnvironmentStore,
    SourceBuildRefused,
    archive_url,
    lock_key,
    parse_environment,
)
from tests.envfixtures import (  # noqa: F401
    INTEROP_PYTHON,
    ROOT,
    Projects,
    counting_uv,
    on_path_fixture,
    pack_environment,
    projects_fixture,
    py312_fixture,
    registry_server,
    run_python,
    uv_fixture,
)

pytestmark = pytest.mark.usefixtures("on_path")


async def test_an_environment_is_built_once_then_reused(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    store = EnvironmentStore(tmp_path / "envs", uv=uv)
    spec = projects.basic.spec()
    built = await store.ensure(spec)
    assert built.origin is EnvironmentOrigin.BUILT and built.installed
    assert built.python_version == "3.12" and built.lock_key == spec.key
    assert built.path == tmp_path / "envs" / built.dir_key
    assert (built.path / ".strata-env-complete").exists()
    assert (tmp_path / "envs" / f"{built.dir_key}.project" / "uv.lock").read_text() == spec.lockfile
    assert run_python(built.python, "import six, idna; print(six.__version__)") == "1.16.0"

    again = await store.ensure(spec)
    assert again.origin is EnvironmentOrigin.CACHED and not again.installed
    assert again.dir_key == built.dir_key
    # a second store (another worker on this host) finds it too, without uv sync
    other = await EnvironmentStore(tmp_path / "envs", uv=uv).ensure(spec)
    assert other.origin is EnvironmentOrigin.CACHED and other.path == built.path


async def test_another_lock_is_another_environment(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    store = EnvironmentStore(tmp_path / "envs", uv=uv)
    basic = await store.ensure(projects.basic.spec())
    other = await store.ensure(projects.other.spec())
    assert basic.dir_key != other.dir_key
    assert run_python(other.python, "import six; print(six.__version__)") == "1.17.0"
    assert "idna" not in run_python(other.python, "import sys; print(sorted(sys.modules))")
    assert run_python(basic.python, "import six; print(six.__version__)") == "1.16.0"


async def test_an_environment_whose_interpreter_vanished_is_rebuilt(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    built = await EnvironmentStore(tmp_path / "envs", uv=uv).ensure(projects.basic.spec())
    built.python.unlink()
    built.python.symlink_to(tmp_path / "uninstalled" / "python3.12")
    again = await EnvironmentStore(tmp_path / "envs", uv=uv).ensure(projects.basic.spec())
    assert again.origin is EnvironmentOrigin.BUILT and again.dir_key == built.dir_key
    assert run_python(again.python, "import six; print(six.__version__)") == "1.16.0"


RACER = """
import asyncio, json, sys
from pathlib import Path
from kernel_worker.environments import EnvironmentStore, parse_environment
spec = parse_environment(json.loads(Path(sys.argv[3]).read_text()))
built = asyncio.run(EnvironmentStore(Path(sys.argv[1]), uv=sys.argv[2]).ensure(spec))
print(built.origin.value, built.dir_key)
"""


def test_two_processes_racing_build_once(tmp_path: Path, uv: str, projects: Projects) -> None:
    counter, gate = tmp_path / "syncs", tmp_path / "gate"
    wrapper = counting_uv(tmp_path / "uv", uv, counter, gate=gate)
    (tmp_path / "spec.json").write_text(json.dumps(projects.basic.raw()))
    (tmp_path / "racer.py").write_text(RACER)
    argv = [
        sys.executable,
        str(tmp_path / "racer.py"),
        str(tmp_path / "envs"),
        wrapper,
        str(tmp_path / "spec.json"),
    ]
    racers = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        # one is inside uv sync (held at the gate), the other waits on the same lock file
        _wait_for(lambda: counter.exists() and _holding_lock(racers, tmp_path / "envs") == 2)
        gate.touch()
        outputs = [racer.communicate(timeout=120)[0].split() for racer in racers]
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
                racer.wait(timeout=10)
    assert all(racer.returncode == 0 for racer in racers)
    assert sorted(origin for origin, _ in outputs) == ["built", "cached"]
    assert len({key for _, key in outputs}) == 1
    assert len(counter.read_text().split()) == 1


def _holding_lock(racers: list[subprocess.Popen[str]], root: Path) -> int:
    """How many of *racers* have an environment's lock file open."""
    count = 0
    for racer in racers:
        try:
            files = psutil.Process(racer.pid).open_files()
        except psutil.NoSuchProcess:
            continue
        count += any(f.path.startswith(str(root)) and f.path.endswith(".lock") for f in files)
    return count


def _wait_for(condition: object, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


async def test_a_failed_build_leaves_nothing_and_is_retried(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    counter = tmp_path / "syncs"
    store = EnvironmentStore(
        tmp_path / "envs", uv=counting_uv(tmp_path / "uv", uv, counter, fail_first=True)
    )
    spec = projects.basic.spec()
    with pytest.raises(EnvironmentBuildError, match=r"^uv sync failed on this worker"):
        await store.ensure(spec)
    leftovers = [p.name for p in (tmp_path / "envs").iterdir()]
    assert not any(len(name) == 32 for name in leftovers), leftovers  # no environment directory
    built = await store.ensure(spec)
    assert built.origin is EnvironmentOrigin.BUILT
    assert len(counter.read_text().split()) == 2
    assert run_python(built.python, "import six; print(six.__version__)") == "1.16.0"


@pytest.mark.slow
async def test_a_lock_uv_cannot_install_fails_with_uvs_reason(
    tmp_path: Path, uv: str, projects: Projects, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = projects.basic.raw()
    broken = raw["lockfile"].replace("files.pythonhosted.org", "127.0.0.1:9")
    spec = parse_environment({**raw, "lockfile": broken, "key": lock_key(broken)})
    assert spec is not None
    monkeypatch.setenv("UV_NO_CACHE", "1")
    with pytest.raises(
        EnvironmentBuildError, match=r"uv sync failed on this worker: (?s:.*)127\.0\.0\.1"
    ):
        await EnvironmentStore(tmp_path / "envs", uv=uv).ensure(spec)
    assert not list((tmp_path / "envs").glob("*/.strata-env-complete"))


async def test_source_builds_are_refused_unless_allowed(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    spec = projects.sdist.spec()
    refusing = EnvironmentStore(tmp_path / "envs", uv=uv, source_build_hint="--allow-source-builds")
    with pytest.raises(SourceBuildRefused) as refused:
        await refusing.ensure(spec)
    assert refused.value.packages == ("tinypkg==0.1.0",)
    message = str(refused.value)
    assert message.startswith("tinypkg==0.1.0 has no wheel, and building from source")
    assert "(allow them with --allow-source-builds)" in message
    assert not list((tmp_path / "envs").glob("*/.strata-env-complete"))

    allowing = EnvironmentStore(tmp_path / "envs", uv=uv, allow_source_builds=True)
    built = await allowing.ensure(spec)
    assert built.origin is EnvironmentOrigin.BUILT
    assert run_python(built.python, "import tinypkg; print(tinypkg.VALUE)") == "42"


async def test_no_python_of_the_requested_minor(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    spec = projects.basic.spec()
    spec = type(spec)(spec.key, "3.99", spec.lockfile, spec.pyproject)
    with pytest.raises(EnvironmentBuildError, match=r"^no Python 3\.99 on this worker: "):
        await EnvironmentStore(tmp_path / "envs", uv=uv).ensure(spec)


@pytest.mark.skipif(not INTEROP_PYTHON.exists(), reason="no interop environment")
async def test_the_reference_worker_reuses_our_environment(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    built = await EnvironmentStore(tmp_path / "envs", uv=uv).ensure(projects.basic.spec())
    code = (
        "import asyncio, json, sys\n"
        "from strata.notebook.worker_env import ensure_environment\n"
        "got = asyncio.run(ensure_environment(json.load(sys.stdin)))\n"
        "print(got.key, got.installed)\n"
    )
    env = {**os.environ, "STRATA_WORKER_ENV_ROOT": str(tmp_path / "envs")}
    env["PATH"] = f"{Path(uv).parent}{os.pathsep}{env['PATH']}"
    done = await asyncio.to_thread(
        subprocess.run,
        [str(INTEROP_PYTHON), "-c", code],
        input=json.dumps(projects.basic.raw()),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [built.dir_key, "False"]


# --- the registry ---


async def _published(
    tmp_path: Path, uv: str, projects: Projects, python_link: str | None = None
) -> tuple[Path, str]:
    """Build the basic environment elsewhere and publish it; the registry folder and build."""
    built = await EnvironmentStore(tmp_path / "publisher", uv=uv).ensure(projects.basic.spec())
    build = run_python(built.python, _BUILD)
    registry = tmp_path / "registry"
    archive = Path(archive_url(str(registry), built.lock_key, build))
    pack_environment(built.path, archive, python_link=python_link)
    return archive, build


_BUILD = (
    "import platform, sys, sysconfig\n"
    "print(f'{sys.implementation.name}-{platform.python_version()}{sys.abiflags}', sysconfig.get_platform())"
)


async def test_an_environment_is_fetched_from_the_registry(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    archive, build = await _published(tmp_path, uv, projects)
    assert archive.parent.name == build.split()[0]  # <key>/<implementation-version>/<platform>
    with registry_server(tmp_path / "registry") as url:
        store = EnvironmentStore(tmp_path / "envs", uv=uv, registry_url=url)
        fetched = await store.ensure(projects.basic.spec())
    assert fetched.origin is EnvironmentOrigin.FETCHED
    assert run_python(fetched.python, "import six; print(six.__version__)") == "1.16.0"
    assert not list((tmp_path / "envs").glob(".*tmp-*"))  # scratch removed


async def test_a_python_link_to_another_machines_path_is_repointed(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    await _published(tmp_path, uv, projects, python_link="/nonexistent/pythons/3.12/bin/python3.12")
    with registry_server(tmp_path / "registry") as url:
        fetched = await EnvironmentStore(tmp_path / "envs", uv=uv, registry_url=url).ensure(
            projects.basic.spec()
        )
    assert fetched.origin is EnvironmentOrigin.FETCHED
    assert os.readlink(fetched.python) != "/nonexistent/pythons/3.12/bin/python3.12"
    assert run_python(fetched.python, "import six, sys; print(sys.prefix)") == str(fetched.path)


@pytest.mark.parametrize("damage", ["missing", "garbage", "no-interpreter"])
async def test_an_unusable_archive_falls_back_to_a_build(
    damage: str, tmp_path: Path, uv: str, projects: Projects
) -> None:
    archive, _ = await _published(tmp_path, uv, projects)
    if damage == "missing":
        archive.unlink()
    elif damage == "garbage":
        archive.write_bytes(b"not a tar archive at all")
    else:
        _drop_interpreter(archive)
    with registry_server(tmp_path / "registry") as url:
        built = await EnvironmentStore(tmp_path / "envs", uv=uv, registry_url=url).ensure(
            projects.basic.spec()
        )
    assert built.origin is EnvironmentOrigin.BUILT
    assert run_python(built.python, "import six; print(six.__version__)") == "1.16.0"


def _drop_interpreter(archive: Path) -> None:
    """Rewrite *archive* without ``bin/python*``."""
    with tarfile.open(archive) as tar:
        kept = [
            (member, tar.extractfile(member).read() if member.isfile() else None)  # type: ignore[union-attr]
            for member in tar.getmembers()
            if not member.name.startswith("bin/python")
        ]
    with tarfile.open(archive, "w:gz") as tar:
        for member, data in kept:
            tar.addfile(member, io.BytesIO(data) if data is not None else None)


async def test_an_unreachable_registry_falls_back_to_a_build(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    store = EnvironmentStore(tmp_path / "envs", uv=uv, registry_url="http://127.0.0.1:9")
    built = await store.ensure(projects.basic.spec())
    assert built.origin is EnvironmentOrigin.BUILT
