"""Kernels forked from the fork server (the default), and spawned ones (``fork_server=False``)."""

from __future__ import annotations

import asyncio
import base64
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

import kernel_pool
from bench.soak import zombies
from kernel_pool import (
    KernelDied,
    KernelKind,
    KernelStartError,
    Lease,
    Pool,
    PoolConfig,
    PreloadError,
)
from kernel_pool.forkserver import FORK_SERVER_SCRIPT, ForkedKernelProcess, ForkServer
from kernel_pool.shipping import INKERNEL, load_code
from tests.conftest import alive, start_worker, wait_gone
from tests.markers import full_run_only
from tests.pool.test_pool import run, running, settle
from tests.setups import kernel_setup
from tests.waiting import wait_until
from tests.wire import run_ok


def children_of(pid: int) -> set[int]:
    return {p.pid for p in psutil.Process(pid).children() if p.status() != psutil.STATUS_ZOMBIE}


def fork_server_of(pool: Pool) -> psutil.Process:
    """The (one) fork server among this process's children (a test runs one pool at a time)."""
    servers = [
        p for p in psutil.Process().children()
        if alive(p.pid) and FORK_SERVER_SCRIPT in " ".join(p.cmdline())
    ]  # fmt: skip
    assert len(servers) == 1, servers
    return servers[0]


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def kernel_pids(pool: Pool) -> set[int]:
    return {pid for pid in pool.kernel_pids().values() if pid}


async def facts(lease: Lease) -> dict[str, object]:
    code = (
        "import json, os, sys, threading\n"
        "print(json.dumps({'ppid': os.getppid(), 'cwd': os.getcwd(), 'path': sys.path,\n"
        "    'pgid': os.getpgid(0), 'sid': os.getsid(0), 'pid': os.getpid(),\n"
        "    'environ': open('/proc/self/environ', 'rb').read().decode(errors='replace'),\n"
        "    'env': dict(os.environ), 'fds': sorted(os.listdir('/proc/self/fd'))}))\n"
    )
    return dict(json.loads(await run(lease, code)))


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    async with Pool(PoolConfig(size=2)) as p:
        yield p


async def test_forked_kernels_are_children_of_the_pools_process(pool: Pool) -> None:
    """Forked through a go-between and adopted: to an observer, just like spawned kernels."""
    server = fork_server_of(pool)
    assert kernel_pids(pool) <= children_of(os.getpid())
    assert not children_of(server.pid)  # the go-betweens are gone
    # forking is only safe from a process with one thread: nothing it imports may start one
    assert server.num_threads() == 1
    assert server.cmdline()[1:2] == [
        os.path.join(os.path.dirname(kernel_pool.__file__), "forkserver", "_zygote.py")
    ]
    for pid in pool.kernel_pids().values():  # shown as a spawned kernel would be
        assert pid is not None
        command = psutil.Process(pid).cmdline()
        assert command[:3] == [sys.executable, "-m", "ipykernel_launcher"], command
        assert "--HistoryManager.enabled=False" in command
        # no connection file: the key never touches the disk (nor the command line)
        assert "-f" not in command and not any("connection" in part for part in command)
    async with pool.lease() as lease:
        seen = await facts(lease)
    assert seen["ppid"] == os.getpid()
    env = seen["env"]
    assert isinstance(env, dict) and env["JPY_PARENT_PID"] == str(os.getpid())
    # leads its own session, as a spawned kernel does: signals to its group reach only it
    assert seen["pid"] == seen["pgid"] == seen["sid"]
    path = seen["path"]
    assert isinstance(path, list) and seen["cwd"] == os.getcwd() and path[0] == os.getcwd()
    assert os.path.dirname(kernel_pool.__file__) not in path  # where the fork server lives


async def test_forked_kernels_see_only_the_pool_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WORKER_ONLY_SECRET", "s3cret")
    env = {"PATH": os.environ["PATH"], "GIVEN": "yes"}
    async with Pool(PoolConfig(size=1, env=env, gpu_slots=("7",))) as pool, pool.lease() as lease:
        seen = await facts(lease)
    kernel_env = seen["env"]
    assert isinstance(kernel_env, dict)
    assert kernel_env["GIVEN"] == "yes" and kernel_env["CUDA_VISIBLE_DEVICES"] == "7"
    assert "WORKER_ONLY_SECRET" not in kernel_env
    # not in the process's initial environment block either (what /proc shows)
    assert "s3cret" not in str(seen["environ"])


async def test_a_forked_kernel_inherits_no_descriptor_of_the_pool(pool: Pool) -> None:
    async with pool.lease() as first, pool.lease() as second:
        a, b = await facts(first), await facts(second)
    # both kernels hold the same set of descriptors (their own sockets), none of the
    # status pipes of kernels forked before them
    assert len(a["fds"]) == len(b["fds"])  # type: ignore[arg-type]


@pytest.mark.parametrize("fork_server", [True, full_run_only(False)], ids=["forked", "spawned"])
@pytest.mark.parametrize(
    ("code", "status"),
    [("import os\nos._exit(3)", 3), ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", -9)],
    ids=["exit-3", "sigkill"],
)  # fmt: skip
async def test_exit_status_of_a_dead_kernel(fork_server: bool, code: str, status: int) -> None:
    async with Pool(PoolConfig(size=1, kind=KernelKind(fork=fork_server))) as pool:
        async with pool.lease() as lease:
            with pytest.raises(KernelDied) as died:
                await lease.execute(code, deadline=time.monotonic() + 20)
        assert died.value.exit_code == status
        await settle(pool, idle=1)
        async with pool.lease() as lease:
            assert await run(lease, "print(6 * 7)") == "42\n"


@pytest.mark.parametrize("fork_server", [True, full_run_only(False)], ids=["forked", "spawned"])
async def test_a_kernel_that_exits_during_start_up(fork_server: bool) -> None:
    bad = ("--IPKernelApp.transport=bogus",)  # ipykernel refuses it
    config = PoolConfig(size=1, extra_arguments=bad, kind=KernelKind(fork=fork_server))
    with pytest.raises(KernelStartError, match=r"exited during start-up \(exit status 1\)"):
        await Pool(config).start()
    # the failed start cleaned up after itself: no fork server (or kernel) of it is left
    leftovers = [" ".join(p.cmdline()) for p in psutil.Process().children() if alive(p.pid)]
    assert not [c for c in leftovers if FORK_SERVER_SCRIPT in c or "ipykernel" in c], leftovers


@pytest.mark.parametrize("fork_server", [True, full_run_only(False)], ids=["forked", "spawned"])
async def test_a_preload_that_kills_its_kernel_fails_the_start_with_a_preload_error(
    fork_server: bool,
) -> None:
    config = PoolConfig(size=1, kind=KernelKind(fork=fork_server, preload="import os\nos._exit(7)"))
    # forked: the preload runs once, in the template (the fork server), before any kernel
    died = "template" if fork_server else "kernel"
    with pytest.raises(PreloadError, match=rf"the {died} died running it \(exit status 7\)"):
        await Pool(config).start()


@pytest.mark.slow
async def test_spawned_kernels_interrupt_and_run() -> None:
    async with Pool(PoolConfig(size=1, kind=KernelKind(fork=False))) as pool:
        (pid,) = pool.kernel_pids().values()
        assert pid is not None and psutil.Process(pid).ppid() == os.getpid()
        async with pool.lease() as lease:
            assert (
                await run(lease, "import sys; print(sys.argv[0].endswith('ipykernel_launcher.py'))")
                == "True\n"
            )
            task = await running(lease, "import time\ntime.sleep(30)")
            await lease.interrupt()
            assert (await task).reply.get("ename") == "KeyboardInterrupt"
            assert await run(lease, "print('still here')") == "still here\n"


@pytest.mark.slow
async def test_losing_the_fork_server_loses_no_kernel() -> None:
    async with Pool(PoolConfig(size=2)) as pool:
        server = fork_server_of(pool)
        kernels = kernel_pids(pool)
        os.kill(server.pid, signal.SIGKILL)
        server.wait(10)
        # time passing is the point: past the kernels' lifeline and parent-poller periods
        await asyncio.sleep(1.5)
        assert kernel_pids(pool) == kernels and all(alive(pid) for pid in kernels)
        async with pool.lease() as lease:
            assert await run(lease, "print('still warm')") == "still warm\n"
            lease.retire()  # its replacement needs a fork server: a new one starts
        await settle(pool, idle=2)
        replacement = fork_server_of(pool)
        assert replacement.pid != server.pid
        assert len(kernel_pids(pool) - kernels) == 1
    assert not alive(replacement.pid)


async def test_closing_the_pool_stops_the_fork_server_and_every_kernel() -> None:
    pool = Pool(PoolConfig(size=2, spares=1))
    await pool.start()
    server = fork_server_of(pool)
    kernels = kernel_pids(pool)
    assert len(kernels) == 3
    await pool.aclose()
    assert not alive(server.pid)
    assert not any(alive(pid) for pid in kernels)


@pytest.mark.parametrize("fork_server", [True, full_run_only(False)], ids=["forked", "spawned"])
async def test_closing_the_pool_lets_kernels_exit_cleanly(
    fork_server: bool, tmp_path: Path
) -> None:
    """Asked to shut down (not killed): the kernel's own exit handlers run (here one that a
    module registers as it is imported: it stays, as the module does)."""
    marker = tmp_path / "exited"
    (tmp_path / "says_bye.py").write_text(
        f"import atexit, pathlib\natexit.register(pathlib.Path({str(marker)!r}).write_text, 'bye')\n"
    )
    async with Pool(PoolConfig(size=1, kind=KernelKind(fork=fork_server))) as pool:
        async with pool.lease() as lease:
            await run(lease, f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport says_bye")
        await settle(pool, idle=1)  # back in the pool (a reset in flight is cut by closing)
        assert not marker.exists()
    assert marker.read_text() == "bye"


async def test_a_fork_whose_start_was_abandoned_is_killed_not_leaked(tmp_path: Path) -> None:
    server = ForkServer(os.environ)
    try:

        async def fork(name: str, seconds: float) -> ForkedKernelProcess:
            deadline = time.monotonic() + seconds
            return await _spawn(server, tmp_path / f"{name}.json", deadline)

        def named(name: str) -> list[int]:
            marker = str(tmp_path / f"{name}.json")
            return [p.pid for p in psutil.process_iter() if alive(p.pid) and marker in _cmdline(p)]

        zombies_before = set(zombies(os.getpid()))
        running = await fork("running", 30)
        with pytest.raises(KernelStartError, match="in time"):
            await fork("abandoned", 0)  # the fork server forks it all the same
        kept = await fork("kept", 30)
        deadline = time.monotonic() + 10
        # the orphan was killed (and reaped, wherever it went); the other kernels live on
        while named("abandoned") or set(zombies(os.getpid())) - zombies_before:
            assert time.monotonic() < deadline, (named("abandoned"), zombies(os.getpid()))
            await asyncio.sleep(0.05)
        assert named("running") == [running.pid] and named("kept") == [kept.pid]
        for kernel in (running, kept):
            kernel.watch(lambda status: None)
            kernel.signal_group(signal.SIGKILL)
            assert await kernel.wait(10) and kernel.returncode == -signal.SIGKILL
    finally:
        await server.aclose()


async def test_a_fork_cancelled_while_forking_is_killed_with_no_later_request(
    tmp_path: Path,
) -> None:
    """A start cancelled while the fork server forks (a pool closing while a replacement
    starts): no later request reads its reply, and the kernel ran on for good."""
    server = ForkServer(os.environ)
    marker = str(tmp_path / "cancelled.json")
    try:
        deadline = time.monotonic() + 30
        forking = asyncio.ensure_future(_spawn(server, Path(marker), deadline))
        # the moment is the case under test: the request is sent, the fork server forking
        await asyncio.sleep(0.05)
        forking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await forking
    finally:
        await server.aclose()
    deadline = time.monotonic() + 10
    while [p for p in psutil.process_iter() if alive(p.pid) and marker in _cmdline(p)]:
        assert time.monotonic() < deadline, "the cancelled fork's kernel was left running"
        await asyncio.sleep(0.05)


async def _spawn(server: ForkServer, marker: Path, deadline: float) -> ForkedKernelProcess:
    """A kernel forked straight from the fork server; ``marker`` shows in its command line
    (ipykernel is given no connection file: it binds the sockets the request names)."""
    ports = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
    connection: dict[str, Any] = {"transport": "ipc", "ip": str(marker.with_suffix(".ipc"))}
    connection.update({name: number for number, name in enumerate(ports, 1)})
    read_end, write_end = os.pipe()
    try:
        kernel = await server.spawn(
            ["-f", str(marker)], os.environ, str(marker.parent), None, INKERNEL.name,
            load_code((INKERNEL,)), deadline,
            connection=connection, key_fd=write_end,
        )  # fmt: skip
        os.close(write_end)
        write_end = -1
        assert len(await asyncio.to_thread(os.read, read_end, 64)) == 64  # its key
        return kernel
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


async def _start_and_close(config: PoolConfig) -> None:
    async with Pool(config):
        pass


def _prctl(option: int, value: object) -> int:
    return int(ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0))


def is_subreaper() -> bool:
    flag = ctypes.c_int(0)
    assert _prctl(37, ctypes.byref(flag)) == 0  # PR_GET_CHILD_SUBREAPER
    return bool(flag.value)


@pytest.mark.slow
async def test_the_pool_adopts_orphans_only_while_it_forks() -> None:
    """Outside a fork, orphans of cells go where they always went (not to this process)."""
    assert not is_subreaper()
    async with Pool(PoolConfig(size=2)) as pool:
        assert kernel_pids(pool) <= children_of(os.getpid())
        assert not is_subreaper()
    _prctl(36, 1)  # someone else made this process a subreaper: the pool leaves it so
    try:
        async with Pool(PoolConfig(size=1)):
            pass
        assert is_subreaper()
    finally:
        _prctl(36, 0)


@pytest.mark.slow
def test_a_dead_pool_process_takes_its_kernels_with_it(tmp_path: Path) -> None:
    """SIGKILL of the process that owns the pool: the fork server and its kernels exit, and
    the next pool on that runtime directory removes the private directory left behind."""
    script = (
        "import asyncio, json, os, sys\n"
        "from kernel_pool import Pool, PoolConfig\n"
        "async def main():\n"
        f"    pool = Pool(PoolConfig(size=2, runtime_dir={str(tmp_path)!r}))\n"
        "    await pool.start()\n"
        "    print(json.dumps(list(pool.kernel_pids().values())), flush=True)\n"
        "    await asyncio.sleep(3600)\n"
        "asyncio.run(main())\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    started: list[int] = []
    try:
        assert owner.stdout is not None
        kernels = json.loads(owner.stdout.readline())
        servers = children_of(owner.pid) - set(kernels)  # the kernels are its children too
        started = [*kernels, *servers]
        assert len(kernels) == 2 and len(servers) == 1
        owner.kill()
        owner.wait(10)
        wait_gone(started, 10, "kernels outlived the process that owned the pool")
        (left,) = tmp_path.glob("kernel-pool-*")
        asyncio.run(_start_and_close(PoolConfig(size=1, runtime_dir=tmp_path)))
        assert not left.exists()
    finally:
        owner.kill()
        owner.wait(10)
        if owner.stdout is not None:
            owner.stdout.close()
        for pid in started:  # only if the test failed
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_kernel_whose_pool_died_while_it_started_does_not_outlive_it(tmp_path: Path) -> None:
    """The pool's process is killed while its kernel runs a slow per-kernel stage: the
    kernel, adopted by another process before its lifeline started, still exits (it watched
    its new parent, for good)."""
    in_init = tmp_path / "in-kernel-init"
    kernel_init = f"open({str(in_init)!r}, 'w').close()\nimport time\ntime.sleep(3)"
    script = (
        "import asyncio\n"
        "from kernel_pool import KernelKind, Pool, PoolConfig\n"
        f"config = PoolConfig(size=1, runtime_dir={str(tmp_path)!r},\n"
        f"                    kind=KernelKind(kernel_init={kernel_init!r}))\n"
        "asyncio.run(Pool(config).start())\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script])
    kernels: list[int] = []
    try:
        deadline = time.monotonic() + 20
        while not kernels:  # the kernel exists (and sleeps in its preload)
            assert time.monotonic() < deadline, "no kernel started"
            kernels = [
                p.pid for p in psutil.Process(owner.pid).children(recursive=True)
                if "ipykernel" in _cmdline(p)  # (a go-between may be a zombie a moment)
            ]  # fmt: skip
            time.sleep(0.05)
        wait_until(in_init.exists, 20, "the kernel did not reach its kernel_init")
        owner.kill()
        owner.wait(10)
        wait_gone(kernels, 15, "a kernel outlived the pool that was starting it")
    finally:
        owner.kill()
        owner.wait(10)
        for pid in kernels:  # only if the test failed
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


_LOADED_WHERE = "import os\nloaded_in = os.getpid()\n"
_PREPARED = (
    "import json, os, sys\n"
    "m = sys.modules[{name!r}]\n"
    "print(json.dumps({{'pid': os.getpid(), 'loaded_in': m.loaded_in}}))\n"
)


@pytest.mark.parametrize("fork_server", [True, full_run_only(False)])
async def test_shipped_packages_load_once_in_the_fork_server(fork_server: bool) -> None:
    setup = kernel_setup(_LOADED_WHERE, install=False)
    config = PoolConfig(size=2, setup=setup, kind=KernelKind(fork=fork_server))
    code = _PREPARED.format(name=setup.packages[0].name)
    async with Pool(config) as pool, pool.lease() as first, pool.lease() as second:
        seen = [json.loads(await run(lease, code)) for lease in (first, second)]
        server = fork_server_of(pool).pid if fork_server else None
    if fork_server:  # both kernels have what the fork server loaded, once, before forking
        assert [s["loaded_in"] for s in seen] == [server, server]
        assert all(s["pid"] != server for s in seen)
    else:  # a spawned kernel loads it itself
        assert [s["loaded_in"] for s in seen] == [s["pid"] for s in seen]


_INSTALL = (
    "import os\n"
    "def install(shell, hooks):\n"
    "    shell.user_ns['installed_in'] = os.getpid()\n"
    "    hooks.register_reset_hook(lambda: None)\n"
)


@pytest.mark.parametrize("fork_server", [True, full_run_only(False)])
async def test_the_setup_installs_in_every_kernel(fork_server: bool) -> None:
    config = PoolConfig(size=1, setup=kernel_setup(_INSTALL), kind=KernelKind(fork=fork_server))
    async with Pool(config) as pool, pool.lease() as lease:
        ran = await run(lease, "import os\nprint(installed_in == os.getpid())")
    assert ran == "True\n"


async def test_a_shipped_package_that_fails_stops_the_start_with_its_message() -> None:
    setup = kernel_setup("raise ValueError('bad setup')\n", install=False)
    pool = Pool(PoolConfig(size=1, setup=setup))
    with pytest.raises(KernelStartError, match="bad setup"):
        await pool.start()
    await pool.aclose()


@pytest.mark.parametrize(
    "own_session", [False, full_run_only(True)], ids=["in-its-session", "own-session"]
)
async def test_children_a_retired_kernel_leaves_to_this_process_are_reaped(
    own_session: bool,
) -> None:
    """A cell's subprocess is killed with its retired kernel while the replacement is being
    forked; orphaned then, it is this process's child, and must not stay a zombie."""
    before = set(zombies(os.getpid()))
    cell = f"import subprocess\nsubprocess.Popen(['sleep', '900'], start_new_session={own_session})"
    async with Pool(PoolConfig(size=1)) as pool:
        for _ in range(3):
            async with pool.lease() as lease:
                await run(lease, cell, last=True)
            await settle(pool, idle=1)
        assert sum(pool.stats().retirements.values()) >= 3  # each cell retired its kernel
        deadline = time.monotonic() + 10
        while set(zombies(os.getpid())) - before:
            assert time.monotonic() < deadline, (
                f"never reaped: {set(zombies(os.getpid())) - before}"
            )
            await asyncio.sleep(0.05)


def test_a_pid_used_again_is_never_taken_for_a_stray() -> None:
    """A pid noted when a kernel's tree was killed may name a later process of ours (a
    Popen child here): its exit status stays its owner's."""
    from kernel_pool.forkserver import server as forkserver

    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    forkserver._killed_with_kernels[child.pid] = -1  # the start time of an earlier holder
    try:
        forkserver._reap_strays()
    finally:
        del forkserver._killed_with_kernels[child.pid]
    assert child.wait(10) == 7


@pytest.mark.slow
def test_a_worker_with_a_large_environment_forks_its_kernels(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The request to fork a kernel carries the environment and the in-kernel sources in one
    datagram: 213 KB of them once outgrew the socket's default buffer (EMSGSIZE)."""
    # 128 KB that do not compress much, in variables of 32 KB (one string's limit is 128 KB)
    big = {f"BIG_SETTING_{i}": base64.b64encode(os.urandom(24 * 1024)).decode() for i in range(4)}
    w = start_worker(tmp_path_factory, "--pool-size", "1", env=big)
    try:
        with httpx.Client(base_url=w.url, timeout=60) as c:
            source = f"import os\nsizes = [len(os.environ[name]) for name in {sorted(big)!r}]"
            bundle = run_ok(c, source)
        assert bundle.variables["sizes"]["preview"] == [len(big[name]) for name in sorted(big)]
    finally:
        w.stop()


async def test_a_preload_failing_with_a_long_message_is_a_preload_error() -> None:
    """The fork server's reply to a preload that raised a 200 KB message is cut to its two
    ends, read whole, and the start fails with a PreloadError that says both."""
    preload = "raise ValueError('start' + 'm' * 200_000 + 'end')"
    with pytest.raises(PreloadError) as failed:
        await Pool(PoolConfig(size=1, kind=KernelKind(preload=preload))).start()
    message = str(failed.value)
    assert "ValueError: startmmm" in message and "mmmend" in message, message[:200]
    assert "characters not kept" in message and len(message) < 64_000


async def test_without_pidfd_a_kernel_is_watched_whoever_its_parent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where pidfd is unavailable and the pool's process could not adopt the kernel (no
    child subreaper), the kernel runs cells, and its death is still seen."""
    monkeypatch.delattr(os, "pidfd_open")
    monkeypatch.setattr(kernel_pool.forkserver.server, "_set_subreaper", lambda on: None)
    async with Pool(PoolConfig(size=1)) as pool, pool.lease() as lease:
        assert lease.pid is not None and lease.pid not in children_of(os.getpid())
        assert await run(lease, "print(6 * 7)") == "42\n"
        with pytest.raises(KernelDied):
            await lease.execute("import os\nos._exit(3)", deadline=time.monotonic() + 20)
