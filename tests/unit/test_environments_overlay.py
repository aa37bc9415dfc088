"""Kernel overlays on real environments, and disk use and eviction by last use."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from kernel_worker.environments import (
    KERNEL_REQUIREMENTS,
    BuiltEnvironment,
    EnvironmentBuildError,
    EnvironmentOrigin,
    EnvironmentStore,
)
from kernel_worker.environments.layout import EnvironmentPaths
from kernel_worker.environments.locking import held
from tests.envfixtures import (  # noqa: F401
    Projects,
    on_path_fixture,
    projects_fixture,
    py312_fixture,
    run_python,
    uv_fixture,
)

pytestmark = pytest.mark.usefixtures("on_path")


def _packages(env: BuiltEnvironment) -> list[str]:
    listed = run_python(
        env.python,
        "import importlib.metadata as m, json\n"
        "print(json.dumps(sorted(f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions())))",
    )
    return list(json.loads(listed))


async def test_the_overlay_runs_a_kernel_under_the_locks_pins(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    store = EnvironmentStore(tmp_path / "envs", uv=uv)
    env = await store.ensure(projects.old_traitlets.spec())
    before = _packages(env)
    made = await store.ensure_kernel_overlay(env)
    overlay = made.path
    assert overlay == tmp_path / "envs" / "kernel-overlays" / made.key
    assert not overlay.is_relative_to(env.path)
    assert not made.shared  # the pin makes it an overlay of its own
    assert "traitlets==5.9.0" in made.requirements
    # the overlay resolved against the lock's pin, not the newest traitlets
    assert [p.name for p in overlay.glob("traitlets-*.dist-info")] == ["traitlets-5.9.0.dist-info"]
    assert list(overlay.glob("ipykernel/__pycache__/*.pyc"))  # compiled at install
    found = run_python(
        env.python,
        "import ipykernel, traitlets, zmq, cloudpickle, pyarrow\n"
        "from ipykernel.kernelapp import IPKernelApp\n"
        "print(traitlets.__version__, traitlets.__file__.startswith(sys.prefix), ipykernel.__file__)",
        path_tail=overlay,
    ).split()
    assert found[:2] == ["5.9.0", "True"]  # the environment's own copy wins
    assert found[2].startswith(str(overlay))
    assert _packages(env) == before  # the user's environment is untouched
    assert not any(p.startswith("ipykernel==") for p in before)
    # made once: a second call finds it
    marker = overlay / ".kernel-overlay-complete"
    made_at = marker.stat().st_mtime_ns
    assert (await store.ensure_kernel_overlay(env)).path == overlay
    assert marker.stat().st_mtime_ns == made_at


async def test_a_pin_the_kernel_cannot_run_with_is_named(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    store = EnvironmentStore(tmp_path / "envs", uv=uv)
    env = await store.ensure(projects.ancient_traitlets.spec())
    with pytest.raises(EnvironmentBuildError) as failed:
        await store.ensure_kernel_overlay(env)
    message = str(failed.value)
    assert message.startswith(
        "the lock pins traitlets==4.3.3, which the kernel cannot run with: "
    ), message
    assert not list((tmp_path / "envs").glob("kernel-overlays/*/"))
    assert not list((tmp_path / "envs").glob("**/.*tmp-*"))
    assert "traitlets==4.3.3" in _packages(env)


def test_the_kernel_requirements() -> None:
    assert KERNEL_REQUIREMENTS[0] == "ipykernel>=6.29"
    assert {"pyzmq", "cloudpickle", "pyarrow"} <= set(KERNEL_REQUIREMENTS)


# --- disk ---


async def _three(store: EnvironmentStore, projects: Projects) -> list[BuiltEnvironment]:
    """Three environments, used an hour, a minute and a second ago."""
    envs = [
        await store.ensure(projects.basic.spec()),
        await store.ensure(projects.other.spec()),
        await store.ensure(projects.old_traitlets.spec()),
    ]
    now = time.time()
    for env, ago in zip(envs, (3600, 60, 1), strict=True):
        os.utime(store.root / f"{env.dir_key}.used", (now - ago, now - ago))
    return envs


async def test_usage_lists_environments_by_last_use(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    store = EnvironmentStore(tmp_path / "envs", uv=uv)
    oldest, middle, newest = await _three(store, projects)
    usage = await store.usage()
    assert [u.dir_key for u in usage] == [oldest.dir_key, middle.dir_key, newest.dir_key]
    assert all(u.bytes > 10_000 for u in usage)
    assert usage[0].path == oldest.path and time.time() - usage[0].last_used_at > 3000
    await store.ensure(projects.basic.spec())  # using it makes it the most recent
    assert (await store.usage())[-1].dir_key == oldest.dir_key


async def test_eviction_keeps_what_is_kept_and_the_most_recent(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    store = EnvironmentStore(tmp_path / "envs", uv=uv)
    oldest, middle, newest = await _three(store, projects)
    sizes = {u.dir_key: u.bytes for u in await store.usage()}
    budget = sizes[oldest.dir_key] + sizes[newest.dir_key]
    removed = await store.evict(max_bytes=budget, keep={oldest.dir_key})
    assert removed == [middle.dir_key]
    assert [u.dir_key for u in await store.usage()] == [oldest.dir_key, newest.dir_key]
    gone = EnvironmentPaths(store.root, middle.dir_key)
    assert not gone.env.exists() and not gone.project.exists() and not gone.used.exists()
    assert gone.lock.exists()  # lock files stay: a waiter may hold the old one
    # asked again, it is built again
    assert (await store.ensure(projects.other.spec())).origin is EnvironmentOrigin.BUILT


async def test_eviction_by_idle_time(tmp_path: Path, uv: str, projects: Projects) -> None:
    store = EnvironmentStore(tmp_path / "envs", uv=uv)
    oldest, middle, newest = await _three(store, projects)
    overlay = (await store.ensure_kernel_overlay(newest)).path
    assert await store.evict(max_idle_seconds=30) == [oldest.dir_key, middle.dir_key]
    assert [u.dir_key for u in await store.usage()] == [newest.dir_key]
    assert overlay.exists()
    # its environment gone, and this process done with it: nothing uses the overlay
    assert await store.evict(max_idle_seconds=0, keep_overlays=set()) == [newest.dir_key]
    assert not overlay.exists()


async def test_eviction_skips_an_environment_another_process_holds(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    store = EnvironmentStore(tmp_path / "envs", uv=uv)
    oldest, middle, _ = await _three(store, projects)
    # another process building (here: holding the lock) the oldest one
    holder = subprocess.Popen(  # noqa: ASYNC220  (started and stopped here, by PID)
        [
            "python3",
            "-c",
            "import fcntl, sys, time\n"
            "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX)\n"
            "print('held', flush=True); time.sleep(60)\n",
            str(EnvironmentPaths(store.root, oldest.dir_key).lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert await store.evict(max_idle_seconds=30) == [middle.dir_key]
    finally:
        holder.kill()
        holder.communicate(timeout=10)
    # while we hold an overlay lock, eviction skips that environment too
    with held(EnvironmentPaths(store.root, oldest.dir_key).overlay_lock, timeout_seconds=5):
        assert await store.evict(max_idle_seconds=30) == []
    assert await store.evict(max_idle_seconds=30) == [oldest.dir_key]


# --- shared overlays ---


async def test_environments_that_pin_none_of_the_kernels_packages_share_one_overlay(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    store = EnvironmentStore(tmp_path / "envs", uv=uv)
    basic = await store.ensure(projects.basic.spec())  # six==1.16.0, idna
    other = await store.ensure(projects.other.spec())  # six==1.17.0
    first = await store.ensure_kernel_overlay(basic)
    marker = first.path / ".kernel-overlay-complete"
    made_at = marker.stat().st_mtime_ns
    second = await store.ensure_kernel_overlay(other)
    assert first.shared and second == first  # one overlay, made once
    assert marker.stat().st_mtime_ns == made_at
    assert [p.name for p in (tmp_path / "envs" / "kernel-overlays").iterdir() if p.is_dir()] == [
        first.key
    ]
    for env in (basic, other):  # each environment names the overlay it uses
        assert (store.root / f"{env.dir_key}.kernel-overlay-key").read_text() == first.key
    # each environment still imports its own six, the overlay's ipykernel
    found = run_python(
        other.python, "import six, ipykernel\nprint(six.__version__, ipykernel.__file__)",
        path_tail=first.path,
    ).split()  # fmt: skip
    assert found[0] == "1.17.0" and found[1].startswith(str(first.path))
    # a lock pinning one of the kernel's packages at another version gets its own
    pinned = await store.ensure_kernel_overlay(await store.ensure(projects.old_traitlets.spec()))
    assert not pinned.shared and pinned.key != first.key
    assert "traitlets==5.9.0" in pinned.requirements
    assert "traitlets==5.9.0" not in first.requirements


async def test_eviction_keeps_a_shared_overlay_while_an_environment_uses_it(
    tmp_path: Path, uv: str, projects: Projects
) -> None:
    store = EnvironmentStore(tmp_path / "envs", uv=uv)
    basic = await store.ensure(projects.basic.spec())
    other = await store.ensure(projects.other.spec())
    shared = await store.ensure_kernel_overlay(basic)
    assert await store.ensure_kernel_overlay(other) == shared
    now = time.time()
    os.utime(store.root / f"{basic.dir_key}.used", (now - 3600, now - 3600))
    # basic goes; other, on disk, still uses the overlay
    assert await store.evict(max_idle_seconds=60, keep_overlays=set()) == [basic.dir_key]
    assert shared.path.is_dir()
    # another process using it (a template, a live pool): it stays while that one holds it
    users = tmp_path / "envs" / "kernel-overlays" / f"{shared.key}.users"
    holder = subprocess.Popen(  # noqa: ASYNC220  (started and stopped here, by PID)
        [
            "python3",
            "-c",
            "import fcntl, sys, time\n"
            "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_SH)\n"
            "print('held', flush=True); time.sleep(60)\n",
            str(users),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert await store.evict(max_idle_seconds=0, keep_overlays=set()) == [other.dir_key]
        assert shared.path.is_dir()  # no environment names it, but a process uses it
    finally:
        holder.kill()
        holder.communicate(timeout=10)
    # used by no environment and no process: removed
    assert await store.evict(max_idle_seconds=0, keep_overlays=set()) == []
    assert not shared.path.exists()
