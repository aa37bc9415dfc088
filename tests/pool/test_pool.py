"""The warm kernel pool, on real kernels (no mocks of jupyter_client)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernel_pool import (
    ExecuteResult,
    ExecutionTimeout,
    KernelDied,
    KernelKind,
    KernelStartError,
    Lease,
    Output,
    Pool,
    PoolBusy,
    PoolConfig,
    PreloadError,
    RecyclePolicy,
)
from tests.conftest import alive
from tests.markers import full_run_only
from tests.setups import kernel_setup
from tests.waiting import eventually


def stdout_of(result: object) -> str:
    outputs = getattr(result, "outputs", ())
    return "".join(o.content.get("text", "") for o in outputs if o.msg_type == "stream")


async def run(lease: Lease, code: str, timeout: float = 20.0, *, last: bool = False) -> str:
    result = await lease.execute(code, deadline=time.monotonic() + timeout, last=last)
    assert result.ok, result.reply
    return stdout_of(result)


async def running(lease: Lease, code: str, timeout: float = 30.0) -> asyncio.Future[ExecuteResult]:
    """Start ``code`` on ``lease`` and return once it is running (it has printed a line
    first), as the task that ends with its result."""
    started = asyncio.Event()

    def seen(output: Output) -> None:
        if output.msg_type == "stream":
            started.set()

    cell = f"print('running', flush=True)\n{code}"
    task = asyncio.ensure_future(
        lease.execute(cell, deadline=time.monotonic() + timeout, on_output=seen)
    )
    waiter = asyncio.ensure_future(started.wait())
    try:
        await asyncio.wait([task, waiter], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if not started.is_set():
        task.cancel()
        raise AssertionError(f"the cell did not start running: {task}")
    return task


@pytest.fixture(
    params=[full_run_only(False), True], ids=["reset-after-lease", "reset-with-last-cell"]
)
def last(request: pytest.FixtureRequest) -> bool:
    """Whether the lease's last cell asks the kernel to reset in the same round trip."""
    return bool(request.param)


def assert_reset_path(pool: Pool, last: bool, leases: int = 1) -> None:
    """Every lease ended by the path under test (inline with the last cell, or a full one)."""
    assert pool.stats().inline_resets == (leases if last else 0), pool.stats()


async def settle(pool: Pool, *, idle: int, timeout: float = 30.0) -> None:
    """Wait (event-free but bounded) until background resets/refills reach ``idle`` kernels."""
    deadline = time.monotonic() + timeout
    while pool.stats().idle < idle:
        assert time.monotonic() < deadline, pool.stats()
        await asyncio.sleep(0.05)


async def run_again_after_reset(pool: Pool, kernel: str, code: str) -> str:
    """Once the lease on ``kernel`` has been reset: ``code``'s stdout, run on that kernel (a
    clean reset keeps it, and the pool's only idle kernel is the one leased)."""
    await settle(pool, idle=1)
    async with pool.lease() as lease:
        assert lease.kernel_id == kernel
        return await run(lease, code)


async def assert_cell_leaves_kernel_unclean(pool: Pool, code: str, *, last: bool) -> None:
    """Run ``code`` as a lease's cell: its kernel is found unclean, retired and replaced."""
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, code, last=last)
    await assert_replaced(pool, first)
    assert_reset_path(pool, last)


async def assert_replaced(pool: Pool, first: str, child: int | None = None) -> None:
    """The kernel ``first`` was found unclean, retired and replaced; ``child`` died with it."""
    await settle(pool, idle=1)
    assert pool.stats().retirements["failed_reset"] == 1
    async with pool.lease() as lease:
        assert lease.kernel_id != first
    deadline = time.monotonic() + 10
    while child is not None and alive(child):
        assert time.monotonic() < deadline, "the cell's child process survived its kernel"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def started(config: PoolConfig) -> AsyncIterator[Pool]:
    """A started pool; afterwards closed, with none of its kernel processes left alive."""
    p = Pool(config)
    await p.start()
    pids = set(p.kernel_pids().values())
    yield p
    pids |= set(p.kernel_pids().values())
    await p.aclose()
    assert not [pid for pid in pids if alive(pid)], "kernel processes outlived the pool"


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    preload = "import json\nmodel = {'weights': [1, 2, 3]}"
    async with started(PoolConfig(size=1, kind=KernelKind(preload=preload))) as p:
        yield p


async def test_lease_executes_and_preload_is_warm(pool: Pool) -> None:
    async with pool.lease() as lease:
        assert await run(lease, "print(model['weights'][1] + 40)") == "42\n"
    assert pool.stats().leases_served == 1


async def test_reset_isolates_consecutive_leases(pool: Pool, last: bool) -> None:
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, (
            "import os, sys, tempfile\n"
            "leaked = 1\n"
            "os.environ['LEAK_VAR'] = 'x'\n"
            "os.chdir(tempfile.gettempdir())\n"
            "sys.path.append('/leak')\n"
            "model = None\n"
            "import matplotlib; matplotlib.use('Agg')\n"
            "import matplotlib.pyplot as plt; plt.figure()\n"
            "1 + 1\n"
        ), last=last)  # fmt: skip
    await settle(pool, idle=1)
    assert_reset_path(pool, last)
    # the preloaded name was replaced: this kernel may not be reused
    async with pool.lease() as lease:
        assert lease.kernel_id != first
        out = await run(lease, (
            "import os, sys\n"
            "print('leaked' in dir(), 'LEAK_VAR' in os.environ, '/leak' in sys.path,\n"
            "      model, repr(_))\n"
        ))  # fmt: skip
    assert out == "False False False {'weights': [1, 2, 3]} ''\n"


async def test_reset_clears_the_output_cache(pool: Pool, last: bool) -> None:
    """Numbered outputs (``_1``, ``Out``), hidden ones included, and the display hook's own
    references are gone after a reset, whatever the execution count has reached."""
    async with pool.lease() as lease:
        kernel = lease.kernel_id
        for _ in range(3):
            await run(lease, "[1, 2, 3]")  # stored history: _<n>, _oh[n], the hook's _
        await run(lease, "get_ipython().user_ns_hidden['_999'] = 'no _oh entry'", last=last)
    out = await run_again_after_reset(pool, kernel, (
        "ip = get_ipython()\n"
        "inputs = [k for k in globals() if k[:2] == '_i' and k[2:].isdigit()]\n"
        "mine = max(inputs, key=lambda k: int(k[2:]))  # this cell's own stored input\n"
        "numbered = [k for k in (*globals(), *ip.user_ns_hidden)\n"
        "            if k.lstrip('_i').isdigit() and k != mine]\n"
        "print(numbered, dict(_oh), repr(ip.displayhook._), repr(_), ip.execution_count > 3)\n"
    ))  # fmt: skip
    assert out == "[] {} '' '' True\n"


async def test_reset_forgets_the_source_of_cells_run_since_the_baseline(
    pool: Pool, last: bool
) -> None:
    """IPython keeps each distinct cell text for tracebacks (``linecache``) for the life of
    the kernel; a reset drops those of the lease's cells, and keeps the preload's (which
    the template ran, under ``<preload>``)."""
    async with pool.lease() as lease:
        kernel = lease.kernel_id
        for n in range(3):
            await run(lease, f"value = {n}  # marker_cell {n}", last=last and n == 2)
    out = await run_again_after_reset(pool, kernel, (
        "import linecache\n"
        "def kept(text):\n"
        "    entries = [linecache.cache.get(n) for n in get_ipython().compile._filename_map]\n"
        "    return sum(text in ''.join(e[2]) for e in entries if e)\n"
        "preload = ''.join(linecache.getlines('<preload>'))\n"
        "print(kept('marker' + '_cell'), int('model = {' + \"'weights'\" in preload))\n"
    ))  # fmt: skip
    assert out == "0 1\n"


async def test_what_a_failed_cell_held_is_freed_after_the_reset(pool: Pool, last: bool) -> None:
    """A failed cell's traceback, its frames and what they hold are not kept for good (the
    reset's collection used to find them alive and freeze them with the baseline)."""
    async with pool.lease() as lease:
        kernel = lease.kernel_id
        result = await lease.execute((
            "import weakref, sys, types\n"
            "class Held:\n"
            "    pass\n"
            "def fail():\n"
            "    held = Held()\n"
            "    box = sys._held_by_failed_cell = types.SimpleNamespace()\n"
            "    box.ref = weakref.ref(held)\n"  # past the reset
            "    raise ValueError('on purpose')\n"
            "fail()\n"
        ), deadline=time.monotonic() + 20, last=last)  # fmt: skip
        assert not result.ok
    out = await run_again_after_reset(pool, kernel, (
        "import gc, sys\n"
        "gc.collect()\n"
        "print(sys.__dict__.pop('_held_by_failed_cell').ref() is None)\n"
    ))  # fmt: skip
    assert out == "True\n"


async def test_reset_reuses_the_same_kernel_when_clean(pool: Pool, last: bool) -> None:
    async with pool.lease() as lease:
        first = lease.kernel_id
        cwd = await run(lease, "import os\nprint(os.getcwd())")
        code = "import os, tempfile\nos.chdir(tempfile.gettempdir())\nx = [0] * 10"
        await run(lease, code, last=last)
    await settle(pool, idle=1)
    assert_reset_path(pool, last)
    async with pool.lease() as lease:
        assert lease.kernel_id == first
        assert await run(lease, "import os\nprint(os.getcwd())") == cwd
        assert await run(lease, "print('x' in dir(), 'tempfile' in dir())") == "False False\n"
        await run(lease, "import matplotlib.pyplot as plt\nprint(plt.get_fignums())")
    stats = pool.stats()
    assert stats.retirements["failed_reset"] == 0


async def test_thread_left_running_retires_the_kernel(pool: Pool, last: bool) -> None:
    code = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()"
    await assert_cell_leaves_kernel_unclean(pool, code, last=last)


async def test_child_process_left_running_retires_the_kernel(pool: Pool, last: bool) -> None:
    async with pool.lease() as lease:
        first = lease.kernel_id
        out = await run(
            lease,
            "import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\nprint(p.pid)",
            last=last,
        )
        child = int(out)
    await assert_replaced(pool, first, child)
    assert_reset_path(pool, last)


async def test_timeout_interrupts_then_retires(pool: Pool) -> None:
    async with pool.lease() as lease:
        first = lease.kernel_id
        with pytest.raises(ExecutionTimeout):
            await lease.execute("import time\ntime.sleep(30)", deadline=time.monotonic() + 0.5)
    assert pool.stats().retirements["timeout"] == 1
    await settle(pool, idle=1)
    async with pool.lease() as lease:
        assert lease.kernel_id != first
        assert await run(lease, "print(1)") == "1\n"


async def test_cell_ignoring_sigint_is_killed_within_grace() -> None:
    config = PoolConfig(size=1, interrupt_grace_seconds=0.5)
    async with Pool(config) as pool, pool.lease() as lease:
        pid = lease.pid
        code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
        started = time.monotonic()
        with pytest.raises(ExecutionTimeout):
            await lease.execute(code, deadline=started + 0.5)
        assert time.monotonic() - started < 0.5 + 0.5 + 3.0
        assert not alive(pid)


@pytest.mark.slow
async def test_kernel_ignoring_sigint_is_killed(fault_kernels: Path) -> None:
    config = PoolConfig(
        size=1, interrupt_grace_seconds=0.3, kind=KernelKind(kernel_name="ignores-sigint")
    )
    async with Pool(config) as pool:
        async with pool.lease() as lease:
            started = time.monotonic()
            with pytest.raises(ExecutionTimeout):
                await lease.execute("while True:\n    pass", deadline=started + 0.5)
            assert time.monotonic() - started < 0.5 + 0.3 + 3.0
        await settle(pool, idle=1)


async def test_death_is_reported_promptly_and_replaced(pool: Pool) -> None:
    for code in ("import os\nos._exit(1)", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
                 "import ctypes\nctypes.string_at(0)"):  # fmt: skip
        async with pool.lease() as lease:
            started = time.monotonic()
            with pytest.raises(KernelDied):
                await lease.execute(code, deadline=started + 30)
            assert time.monotonic() - started < 3.0
        await settle(pool, idle=1)
    assert pool.stats().retirements["died"] == 3


async def test_external_sigkill_mid_cell(pool: Pool) -> None:
    async with pool.lease() as lease:
        pid = lease.pid
        assert pid is not None
        task = await running(lease, "import time\ntime.sleep(20)")
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(KernelDied):
            await asyncio.wait_for(task, 3)
    await settle(pool, idle=1)


async def test_preload_failure_fails_start_with_its_message() -> None:
    pool = Pool(
        PoolConfig(size=1, kind=KernelKind(preload="raise RuntimeError('model file missing')"))
    )
    with pytest.raises(PreloadError, match="RuntimeError: model file missing"):
        await asyncio.wait_for(pool.start(), 30)


async def test_kernel_that_fails_to_start(fault_kernels: Path) -> None:
    pool = Pool(
        PoolConfig(size=1, start_timeout_seconds=10, kind=KernelKind(kernel_name="fails-to-start"))
    )
    with pytest.raises(KernelStartError):
        await asyncio.wait_for(pool.start(), 30)


async def test_unknown_kernelspec() -> None:
    with pytest.raises(KernelStartError, match="no such kernelspec"):
        await Pool(
            PoolConfig(size=1, kind=KernelKind(kernel_name="no-such-kernel-anywhere"))
        ).start()


@pytest.mark.slow
async def test_slow_starting_kernel_is_waited_for(fault_kernels: Path) -> None:
    async with Pool(PoolConfig(size=1, kind=KernelKind(kernel_name="slow-start"))) as pool:
        assert pool.stats().kernel_start.max_seconds >= 1.5
        async with pool.lease() as lease:
            assert await run(lease, "print(2)") == "2\n"


async def test_two_leases_never_share_and_third_waits() -> None:
    async with Pool(PoolConfig(size=2)) as pool:
        async with pool.lease() as a, pool.lease() as b:
            assert a.kernel_id != b.kernel_id
            with pytest.raises(PoolBusy):
                async with pool.lease(wait_seconds=0.2):
                    pass
            waiter = asyncio.ensure_future(_lease_id(pool))
            await asyncio.sleep(0.2)  # time passing is the point: the waiter gets nothing yet
            assert not waiter.done()
            released = a.kernel_id
        assert await asyncio.wait_for(waiter, 10) in {released, b.kernel_id}


async def _lease_id(pool: Pool) -> str:
    async with pool.lease(wait_seconds=10) as lease:
        return lease.kernel_id


async def test_fresh_policy_never_reuses() -> None:
    async with Pool(PoolConfig(size=1, spares=1, recycle=RecyclePolicy.FRESH)) as pool:
        seen = []
        for _ in range(3):
            async with pool.lease(wait_seconds=30) as lease:
                assert lease.uses == 0
                seen.append(lease.kernel_id)
        assert len(set(seen)) == 3
        assert pool.stats().retirements["fresh_policy"] == 3


@pytest.mark.slow
async def test_many_fresh_kernels_with_an_iopub_limit_each_answer() -> None:
    """Every kernel's IOPub socket is watched for dropped connections (with a message
    limit); kernels come and go under ``fresh``, and a later kernel's socket reuses an earlier
    one's descriptor: each still answers (a watch named by descriptor hung after about 12)."""
    config = PoolConfig(size=2, recycle=RecyclePolicy.FRESH, max_iopub_message=512 << 10)
    async with Pool(config) as pool:
        for i in range(30):
            async with pool.lease(wait_seconds=30) as lease:
                assert await run(lease, f"print({i})") == f"{i}\n"


async def test_max_uses() -> None:
    async with Pool(PoolConfig(size=1, max_uses=2)) as pool:
        ids = []
        for _ in range(3):
            async with pool.lease(wait_seconds=30) as lease:
                ids.append(lease.kernel_id)
                await run(lease, "pass")
        assert ids[0] == ids[1] != ids[2]
        assert pool.stats().retirements["max_uses"] == 1


async def test_max_kernel_memory() -> None:
    async with Pool(PoolConfig(size=1, max_kernel_memory=1)) as pool:
        async with pool.lease() as lease:
            first = lease.kernel_id
        await settle(pool, idle=1)
        assert pool.stats().retirements["memory"] >= 1
        async with pool.lease() as lease:
            assert lease.kernel_id != first


async def test_gpu_slots_and_environment() -> None:
    env = {**os.environ, "POOL_TEST_VISIBLE": "yes"}
    env.pop("POOL_TEST_SECRET", None)
    config = PoolConfig(size=2, gpu_slots=("3", "5"), env=env)
    async with Pool(config) as pool:
        async with pool.lease() as a, pool.lease() as b:
            code = "import os\nprint(os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('POOL_TEST_VISIBLE'))"
            seen = {await run(a, code), await run(b, code)}
            assert seen == {"3 yes\n", "5 yes\n"}
            b.retire()
            slot_b = b.slot
        await settle(pool, idle=2)
        async with pool.lease() as a, pool.lease() as b:
            assert {a.slot, b.slot} == {"3", "5"}
            replacement = a if a.uses == 0 else b
            assert replacement.slot == slot_b


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "spawned"])
@pytest.mark.slow
async def test_kernel_folders_are_private_and_removed(fork_server: bool) -> None:
    """A forked kernel has no connection file at all (its key came through a pipe); a
    spawned one's is in its private folder. Both folders go with the pool."""
    pool = Pool(PoolConfig(size=1, kind=KernelKind(fork=fork_server)))
    await pool.start()
    private = pool.private_dir
    assert private is not None
    assert stat.S_IMODE(private.stat().st_mode) & 0o077 == 0
    assert [p.name for p in private.glob("k*/tmp")] == ["tmp"]  # its own temp folder
    assert bool(list(private.glob("k*/connection.json"))) is not fork_server
    await pool.aclose()
    assert not private.exists()


async def test_joblib_memory_maps_into_the_kernels_own_temp_folder(pool: Pool) -> None:
    """Not /dev/shm, joblib's default, where the folders of a killed kernel stay for good:
    the kernel's temp folder goes with the kernel."""
    async with pool.lease() as lease:
        out = await run(
            lease, "import os\nprint(os.environ['JOBLIB_TEMP_FOLDER'] == os.environ['TMPDIR'])"
        )
    assert out == "True\n"


async def test_cancelled_lease_retires_the_kernel(pool: Pool) -> None:
    cell_running = asyncio.Event()

    async def hold_until_running() -> None:
        async with pool.lease() as lease:
            cell = await running(lease, "import time\ntime.sleep(20)")
            cell_running.set()
            await cell

    task = asyncio.ensure_future(hold_until_running())
    await asyncio.wait_for(cell_running.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pool.stats().retirements["cancelled"] == 1
    await settle(pool, idle=1)
    async with pool.lease(wait_seconds=5) as lease:
        assert await run(lease, "print('ok')") == "ok\n"


@pytest.mark.slow
async def test_refill_backs_off_instead_of_looping(fault_kernels: Path) -> None:
    kind = KernelKind(fork=False)
    config = PoolConfig(size=1, restart_backoff_seconds=(0.2, 0.4), kind=kind)
    async with Pool(config) as pool:
        async with pool.lease() as lease:
            lease.retire()
        # break kernel starts from now on: the refill must fail, back off and report it
        object.__setattr__(pool.config, "kind", KernelKind(kernel_name="fails-to-start"))
        # time passing is what is under test: with back-off, 2 s hold only a few failures
        await asyncio.sleep(2.0)
        stats = pool.stats()
        assert 1 <= stats.start_failures <= 8
        assert stats.last_start_error


@pytest.mark.slow
async def test_each_retired_kernel_is_replaced_at_once() -> None:
    # starts that take a while: a kernel retired while another's replacement is still
    # starting must be replaced at once, not after it (else kills that come faster than a
    # start takes drain the pool and requests wait)
    slow = "import time\ndef install(shell, hooks):\n    time.sleep(2.0)\n"
    config = PoolConfig(size=3, setup=kernel_setup(slow))
    async with Pool(config) as pool:
        for retired in (1, 2):
            async with pool.lease() as lease:
                lease.retire()
            await eventually(
                lambda n=retired: pool.stats().kernels_by_state["starting"] >= n,
                30,
                "no replacement started",
            )
        states = pool.stats().kernels_by_state
        assert states["starting"] == 2, states
        assert states["idle"] == 1, states
        deadline = time.monotonic() + 30
        while pool.stats().idle < 3:
            assert time.monotonic() < deadline, pool.stats()
            assert sum(pool.stats().kernels_by_state.values()) <= 3  # never above the target
            await asyncio.sleep(0.05)
        assert pool.stats().retirements["requested"] == 2


async def test_a_replacement_that_cannot_be_made_is_counted_and_retried() -> None:
    """A replacement whose directory cannot be made (the pool's folder gone for a moment)
    is a start failure the health figures show; it gives its slot back, so the pool refills
    once the folder is back."""
    config = PoolConfig(size=1, restart_backoff_seconds=(0.1, 0.2))
    async with Pool(config) as pool:
        private = pool.private_dir
        assert private is not None
        away = private.with_name(private.name + "-away")
        private.rename(away)
        try:
            async with pool.lease() as lease:
                lease.retire()
            deadline = time.monotonic() + 10
            while pool.stats().start_failures < 1:
                assert time.monotonic() < deadline, pool.stats()
                await asyncio.sleep(0.02)
            assert "FileNotFoundError" in (pool.stats().last_start_error or "")
        finally:
            away.rename(private)
        await settle(pool, idle=1)
        async with pool.lease(wait_seconds=10) as lease:
            assert await run(lease, "print('back')") == "back\n"


async def test_kernel_that_exits_while_idle_is_never_leased(pool: Pool) -> None:
    async with pool.lease() as lease:
        first = lease.kernel_id
        # ipykernel's own exit: the kernel stops shortly after answering
        await lease.execute("get_ipython().ask_exit()", deadline=time.monotonic() + 10)
    deadline = time.monotonic() + 10
    while pool.stats().retirements["died"] < 1:
        assert time.monotonic() < deadline, pool.stats()
        await asyncio.sleep(0.05)
    async with pool.lease(wait_seconds=30) as lease:
        assert lease.kernel_id != first
        assert await run(lease, "print(5)") == "5\n"


async def test_comm_messages_reach_in_kernel_code() -> None:
    setup = kernel_setup(
        "def _echo_target(comm, open_msg):\n"
        "    @comm.on_msg\n"
        "    def _(msg):\n"
        "        data = msg['content']['data']\n"
        "        comm.send({'doubled': data['n'] * 2}, buffers=[bytes(b)[::-1] for b in msg['buffers']])\n"
        "def install(shell, hooks):\n"
        "    shell.kernel.comm_manager.register_target('echo', _echo_target)\n"
    )
    async with Pool(PoolConfig(size=1, setup=setup)) as pool, pool.lease() as lease:
        deadline = time.monotonic() + 10
        await lease.send(
            "comm_open", {"comm_id": "c1", "target_name": "echo", "data": {}}, deadline=deadline
        )
        outputs = await lease.send(
            "comm_msg", {"comm_id": "c1", "data": {"n": 21}}, deadline=deadline, buffers=[b"abc"]
        )
        answers = [o for o in outputs if o.msg_type == "comm_msg"]
        assert answers[0].content["data"] == {"doubled": 42}
        assert bytes(answers[0].buffers[0]) == b"cba"


async def test_reset_undoes_interpreter_level_changes(pool: Pool, last: bool) -> None:
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, (
            "import builtins, json, pickle, sys, os, io\n"
            "builtins.sneaky = 1\n"
            "json.dumps = lambda *a, **k: 'patched'\n"
            "pickle.dumps = None\n"
            "del sys.modules['json']\n"
            "sys.modules['csv'] = 'not a module'\n"
            "sys.stdout = io.StringIO()\n"
            "devnull = os.open(os.devnull, os.O_WRONLY)\n"
            "os.dup2(devnull, 2)\n"
        ), last=last)  # fmt: skip
    await settle(pool, idle=1)
    assert_reset_path(pool, last)
    async with pool.lease() as lease:
        assert lease.kernel_id == first  # restored, not retired
        out = await run(lease, (
            "import builtins, json, pickle, sys, csv, os\n"
            "os.system('echo from-fd-2 >&2')\n"
            "print(hasattr(builtins, 'sneaky'), json.dumps([1]), pickle.dumps is None,\n"
            "      type(csv).__name__)\n"
        ))  # fmt: skip
    assert out == "False [1] False module\n"


async def test_modules_a_cell_imported_stay_and_keep_the_kernel(pool: Pool, last: bool) -> None:
    async with pool.lease() as lease:
        first = lease.kernel_id
        before = await run(lease, "import colorsys, sys\nprint(id(colorsys))", last=last)
    after = await run_again_after_reset(
        pool, first, "import sys\nprint(id(sys.modules['colorsys']))"
    )
    assert after == before  # the same module object: still imported, not imported again
    assert_reset_path(pool, last)
    assert pool.stats().retirements["failed_reset"] == 0


async def test_large_outputs_do_not_make_a_kernel_unclean(pool: Pool, last: bool) -> None:
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, "print('x' * 300_000)", last=last)
    await settle(pool, idle=1)
    assert_reset_path(pool, last)
    assert pool.stats().retirements["failed_reset"] == 0
    async with pool.lease() as lease:
        assert lease.kernel_id == first


async def test_last_cell_reset_is_dropped_when_more_runs_after_it(pool: Pool) -> None:
    """A lease used again after its "last" cell gets the full reset (the inline one is stale)."""
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, "a = 1", last=True)
        await run(lease, "leaked = 2")
    await settle(pool, idle=1)
    assert_reset_path(pool, False)
    async with pool.lease() as lease:
        assert lease.kernel_id == first
        assert await run(lease, "print('a' in dir(), 'leaked' in dir())") == "False False\n"


async def test_last_cell_reset_runs_after_the_reply_which_keeps_the_error(pool: Pool) -> None:
    async with pool.lease() as lease:
        result = await lease.execute(
            "doomed = 1\nraise ValueError('boom')", deadline=time.monotonic() + 20, last=True
        )
        assert not result.ok
        assert (result.reply["ename"], result.reply["evalue"]) == ("ValueError", "boom")
        assert "boom" in "".join(result.reply["traceback"])  # the reset came after the reply
        errors = [o for o in result.outputs if o.msg_type == "error"]
        assert errors and "boom" in "".join(errors[0].content["traceback"])
        assert not [o for o in result.outputs if o.msg_type == "kernel_pool_reset"]
        assert lease.reset_pending == result.msg_id
    await settle(pool, idle=1)
    assert pool.stats().inline_resets == 1
    async with pool.lease() as lease:
        out = await run(lease, "import sys\nprint('doomed' in dir(), hasattr(sys, 'last_value'))")
    assert out == "False False\n"


@pytest.mark.slow
async def test_a_slow_last_cell_reset_does_not_hold_back_the_answer(pool: Pool) -> None:
    """The kernel starts the reset once its idle status is out. Freeing millions of objects
    holds the GIL; started at once, the reset kept the thread that sends the status waiting
    until it was done, and the lease's answer with it."""
    cell = (
        "import time\nstarted = time.perf_counter()\n"
        "data = [[i] for i in range(4_000_000)]\n"
        "print(time.perf_counter() - started)"
    )
    async with pool.lease() as lease:
        sent = time.monotonic()
        out = await run(lease, cell, timeout=60, last=True)
        answered = time.monotonic() - sent
    await settle(pool, idle=1)
    assert pool.stats().inline_resets == 1
    reset = pool.stats().reset.last_seconds
    assert reset is not None and reset > 0.05, reset  # the free is slow enough to tell
    waited = answered - float(out)  # beyond the cell's own time
    assert waited < reset / 2, (waited, reset)


async def test_policies_that_replace_the_kernel_skip_the_last_cell_reset() -> None:
    async with Pool(PoolConfig(size=1, max_uses=1)) as pool:
        async with pool.lease(wait_seconds=30) as lease:
            await lease.execute("x = 1", deadline=time.monotonic() + 20, last=True)
            assert lease.reset_pending is None
        assert pool.stats().retirements["max_uses"] == 1
        assert pool.stats().inline_resets == 0


async def test_child_process_started_by_a_finished_thread_retires_the_kernel(
    pool: Pool, last: bool
) -> None:
    """A thread that started a process and ended hands it to the main thread: still found."""
    async with pool.lease() as lease:
        first = lease.kernel_id
        out = await run(lease, (
            "import subprocess, sys, threading\n"
            "box = []\n"
            "def spawn():\n"
            "    box.append(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']))\n"
            "t = threading.Thread(target=spawn)\n"
            "t.start(); t.join()\n"
            "print(box[0].pid)\n"
        ), last=last)  # fmt: skip
        child = int(out)
    await assert_replaced(pool, first, child)


async def test_a_run_cell_hook_left_by_a_cell_retires_the_kernel(pool: Pool, last: bool) -> None:
    """It would outlive the cell and run in the next requests' cells."""
    code = (
        "def sneaky(result=None):\n"
        "    globals()['left_behind'] = 1\n"
        "get_ipython().events.register('post_run_cell', sneaky)\n"
    )
    await assert_cell_leaves_kernel_unclean(pool, code, last=last)
    async with pool.lease() as lease:
        assert await run(lease, "print('left_behind' in dir())") == "False\n"


@pytest.mark.parametrize(
    "leftover",
    [
        "asyncio.get_running_loop().call_later(30, setattr, sys, 'planted', 1)",
        "kept = asyncio.ensure_future(asyncio.sleep(30))",
    ],
    ids=["timer", "task"],
)
async def test_work_left_on_the_kernel_event_loop_retires_the_kernel(
    pool: Pool, last: bool, leftover: str
) -> None:
    """It would run later, in another request's time: like a thread, it makes the kernel unclean."""
    await assert_cell_leaves_kernel_unclean(pool, f"import asyncio, sys\n{leftover}\n", last=last)


async def test_loop_work_a_cell_finishes_itself_is_fine(pool: Pool, last: bool) -> None:
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, (
            "import asyncio\n"
            "done = await asyncio.gather(asyncio.sleep(0.01), asyncio.ensure_future(asyncio.sleep(0)))\n"
        ), last=last)  # fmt: skip
    await settle(pool, idle=1)
    assert pool.stats().retirements["failed_reset"] == 0
    async with pool.lease() as lease:
        assert lease.kernel_id == first


async def test_closing_stops_a_replacement_whose_preload_is_still_running(tmp_path: Path) -> None:
    """A replacement's preload (a model loading for minutes) is cut short by closing the
    pool, and its kernel stopped: the close waited for it, up to the shutdown timeout."""
    marker = tmp_path / "started-once"
    preload = (  # quick the first time, slow for every replacement
        f"import os, time\nif os.path.exists({str(marker)!r}):\n    time.sleep(60)\n"
        f"open({str(marker)!r}, 'w').close()\n"
    )
    pool = Pool(PoolConfig(size=1, kind=KernelKind(preload=preload)))
    await pool.start()
    try:
        async with pool.lease() as lease:
            with pytest.raises(KernelDied):
                await lease.execute("import os\nos._exit(1)", deadline=time.monotonic() + 20)
        deadline = time.monotonic() + 20
        starting: set[int] = set()
        while not starting:  # the replacement is running its preload
            assert time.monotonic() < deadline, pool.stats()
            await asyncio.sleep(0.1)
            starting = {k.pid for k in pool._kernels.values() if k.pid is not None}
    finally:
        closing = time.monotonic()
        await pool.aclose()
        took = time.monotonic() - closing
    assert took < 5, f"closing took {took:.1f}s"
    for pid in starting:
        assert not alive(pid), "the starting kernel outlived the pool"
