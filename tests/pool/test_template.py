"""The template: the preload runs once, in the fork server, and every kernel is a fork of it;
``kernel_init`` runs in each kernel after the fork (real kernels, real worker over HTTP).

A preload counts its runs in a file: the count proves what ran where.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kernel_pool import KernelInitError, KernelKind, Pool, PoolConfig, PreloadError, RecyclePolicy
from tests.conftest import start_worker
from tests.pool.test_pool import run, settle, started
from tests.wire import run_ok

MB = 2**20


def _counting_preload(runs: Path) -> str:
    return (
        "import os\n"
        f"with open({str(runs)!r}, 'a') as fh:\n"
        "    fh.write(f'{os.getpid()}\\n')\n"
        "model = {'weights': [1, 2, 3]}\n"
        "def predict(x):\n"
        "    return sum(model['weights']) * x + offset\n"
        "offset = 0\n"
    )


async def test_the_preload_runs_once_and_every_kernel_has_its_names(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    async with started(
        PoolConfig(size=2, kind=KernelKind(preload=_counting_preload(runs)))
    ) as pool:
        assert len(runs.read_text().split()) == 1  # one run for two kernels
        async with pool.lease() as one, pool.lease() as two:
            for lease in (one, two):
                # the preload's functions see the kernel's namespace as their globals
                out = await run(
                    lease, "offset = 4\nprint(predict(2), predict.__globals__ is globals())"
                )
                assert out == "16 True\n"
        assert runs.read_text().split()[0] not in {str(pid) for pid in pool.kernel_pids().values()}


async def _kill_and_await_replacement(pool: Pool, pid: int | None, *, idle: int) -> None:
    """SIGKILL the kernel ``pid``; return once its replacement is warm (``idle`` kernels)."""
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while pid in pool.kernel_pids().values() or pool.stats().idle < idle:
        assert time.monotonic() < deadline, pool.stats()
        await asyncio.sleep(0.05)


async def test_a_replacement_is_forked_without_running_the_preload_again(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    async with started(
        PoolConfig(size=1, kind=KernelKind(preload=_counting_preload(runs)))
    ) as pool:
        (pid,) = pool.kernel_pids().values()
        await _kill_and_await_replacement(pool, pid, idle=1)
        async with pool.lease() as lease:
            assert await run(lease, "print(predict(1))") == "6\n"
        assert len(runs.read_text().split()) == 1


async def test_under_fresh_a_preloaded_object_changed_in_place_is_pristine_again(
    tmp_path: Path,
) -> None:
    config = PoolConfig(
        size=1,
        spares=1,
        recycle=RecyclePolicy.FRESH,
        kind=KernelKind(preload=_counting_preload(tmp_path / "r")),
    )
    async with started(config) as pool:
        for _ in range(3):
            async with pool.lease() as lease:
                out = await run(lease, "model['weights'].append(9)\nprint(model['weights'])")
                assert out == "[1, 2, 3, 9]\n"
        assert len((tmp_path / "r").read_text().split()) == 1


async def test_kernel_init_runs_once_per_kernel_with_its_gpu_slot(tmp_path: Path) -> None:
    inits = tmp_path / "inits"
    kernel_init = (
        "import os\n"
        "slot = os.environ.get('CUDA_VISIBLE_DEVICES')\n"
        f"with open({str(inits)!r}, 'a') as fh:\n"
        "    fh.write(f'{slot} {os.getpid()}\\n')\n"
        "%config InlineBackend.figure_formats = ['png']\n"  # a cell: magics work here
    )
    config = PoolConfig(
        size=2, gpu_slots=("0", "1"), kind=KernelKind(preload="base = 10", kernel_init=kernel_init)
    )
    async with started(config) as pool:
        pids = {str(pid) for pid in pool.kernel_pids().values()}
        seen = dict(line.split()[::-1] for line in inits.read_text().splitlines())
        assert set(seen) == pids and sorted(seen.values()) == ["0", "1"]
        async with pool.lease() as lease:
            out = await run(
                lease, "import os\nprint(slot == os.environ['CUDA_VISIBLE_DEVICES'], base)"
            )
            assert out == "True 10\n"
            await run(lease, "del slot, base", last=True)
        await settle(pool, idle=2)
        assert pool.stats().retirements["failed_reset"] == 1  # its names are baseline too
        assert len(inits.read_text().splitlines()) == 3  # its replacement ran it once more


@pytest.mark.parametrize(
    ("preload", "message"),
    [
        (
            "import threading, time\n"
            "threading.Thread(target=time.sleep, args=(60,), name='loader', daemon=True).start()\n",
            r"1 thread\(s\) running \(loader\).*--kernel-init",
        ),
        ("import socket\nconnection = socket.socket()\n", r"1 open socket\(s\).*--kernel-init"),
        ("log = open(__import__('os').devnull, 'w')\n", r"1 open file\(s\).*--kernel-init"),
        ("x = 1\n%matplotlib inline\n", r"line 2.*%-magics.*--kernel-init"),
        ("import asyncio\nawait asyncio.sleep(0)\n", r"line 2.*top-level await.*--kernel-init"),
        (
            "def load():\n    raise KeyError('weights')\nload()\n",
            r"KeyError: 'weights' \(line 2, in load\)",
        ),
    ],
    ids=["thread", "socket", "open file", "magic", "await", "raises"],
)
async def test_a_preload_that_cannot_be_the_template_fails_the_start(
    preload: str, message: str
) -> None:
    pool = Pool(PoolConfig(size=1, kind=KernelKind(preload=preload)))
    with pytest.raises(PreloadError, match=message):
        await asyncio.wait_for(pool.start(), 60)


async def test_a_failing_kernel_init_fails_the_start_with_where() -> None:
    pool = Pool(
        PoolConfig(
            size=1,
            kind=KernelKind(preload="x = 1", kernel_init="y = 2\nraise ValueError('no gpu')"),
        )
    )
    with pytest.raises(KernelInitError, match=r"ValueError: no gpu \(line 2\)"):
        await asyncio.wait_for(pool.start(), 60)


async def test_spawned_kernels_run_the_preload_each_with_the_same_result(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    config = PoolConfig(size=2, kind=KernelKind(fork=False, preload=_counting_preload(runs)))
    async with started(config) as pool:
        async with pool.lease() as lease:
            assert (
                await run(lease, "print(predict(2), predict.__globals__ is globals())")
                == "12 True\n"
            )
        assert len(runs.read_text().split()) == 2


@pytest.mark.slow
def test_the_kernels_share_the_templates_memory(tmp_path_factory: pytest.TempPathFactory) -> None:
    """/health reports each kernel's PSS and USS and the template's: a 200 MB preloaded
    object counts about once across the template and its kernels, not once per kernel."""
    folder = tmp_path_factory.mktemp("model")
    preload = folder / "preload.py"
    preload.write_text("weights = bytearray(b'w' * (200 * 2**20))\n")
    w = start_worker(tmp_path_factory, "--pool-size", "3", "--preload", str(preload))
    try:
        with httpx.Client(base_url=w.url, timeout=60) as client:
            run_ok(client, "n = len(weights)")
            memory = client.get("/health").json()["pool"]["memory"]
            metrics = client.get("/metrics").text
    finally:
        w.stop()
    assert len(memory["kernels"]) == 3 and memory["template"]["rss"] > 200 * MB
    shared = memory["kernels_pss_total"] + memory["template"]["pss"]
    # the model once, plus the interpreters' own memory; per-kernel preloads: 4x (800+ MB)
    assert shared < 2 * 200 * MB, memory
    assert all(k["uss"] < 100 * MB for k in memory["kernels"].values()), memory
    assert 'strata_kernel_worker_kernel_memory_bytes{kernel="k1",kind="pss"}' in metrics
    assert 'strata_kernel_worker_template_memory_bytes{kind="pss"}' in metrics


@pytest.mark.slow
def test_kernel_init_and_a_refused_preload_through_the_command_line(tmp_path: Path) -> None:
    preload, kernel_init = tmp_path / "preload.py", tmp_path / "init.py"
    preload.write_text(
        "import threading\nthreading.Thread(target=threading.Event().wait, name='stuck',"
        " daemon=True).start()\n"
    )
    kernel_init.write_text("ready = True\n")
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_worker", "--port", "0", "--pool-size", "1",
         "--preload", str(preload), "--kernel-init", str(kernel_init)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert f"the preload {preload} failed: it left what a fork cannot copy" in proc.stderr
    assert "(stuck); move it to --kernel-init" in proc.stderr and "Traceback" not in proc.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "kernel_worker", "--kernel-init", str(tmp_path / "none.py")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 2 and "--kernel-init: no such file" in missing.stderr


async def test_a_traceback_through_a_preloaded_function_shows_its_source() -> None:
    preload = "def load(name):\n    raise LookupError(f'no weights for {name}')\n"
    async with (
        started(PoolConfig(size=1, kind=KernelKind(preload=preload))) as pool,
        pool.lease() as lease,
    ):
        result = await lease.execute("load('bert')", deadline=time.monotonic() + 20)
    assert not result.ok
    text = "\n".join(
        line for o in result.outputs if o.msg_type == "error" for line in o.content["traceback"]
    )
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # IPython's colours
    assert "<preload>" in text and "raise LookupError(f'no weights for {name}')" in text, text


@pytest.mark.slow
async def test_a_scikit_learn_model_fitted_once_serves_every_kernel(tmp_path: Path) -> None:
    """A real model, from the data the package ships: fitted once in the template, used by
    every kernel and by a replacement, never fitted again."""
    runs = tmp_path / "fits"
    preload = (
        "from sklearn.datasets import load_iris\n"
        "from sklearn.linear_model import LogisticRegression\n"
        "_X, _y = load_iris(return_X_y=True)\n"
        "model = LogisticRegression(max_iter=500).fit(_X, _y)\n"
        f"open({str(runs)!r}, 'a').write('fit\\n')\n"
    )
    cell = "print(model.predict([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]).tolist())"
    async with started(PoolConfig(size=2, kind=KernelKind(preload=preload))) as pool:
        async with pool.lease() as one, pool.lease() as two:
            assert await run(one, cell) == await run(two, cell) == "[0, 2]\n"
            pid = one.pid
        await _kill_and_await_replacement(pool, pid, idle=2)
        async with pool.lease() as lease, pool.lease() as other:
            for kernel in (lease, other):
                assert await run(kernel, cell) == "[0, 2]\n"
    assert runs.read_text() == "fit\n"
