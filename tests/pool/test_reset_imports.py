"""What a reset keeps and removes of ``sys.modules``, and which threads and processes left
running are a library's warm state (real kernels, both reset paths).

The libraries are small modules written for the test into a folder the preload puts on
``sys.path``, each doing one thing real libraries do: a module that puts an alias in
``sys.modules`` or replaces itself with a wrapper as it is imported, a monitor thread kept
as a class attribute (as tqdm's), a module-wide thread pool (as dask's), a thread started
for a caller's function, a thread nobody keeps.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernel_pool import KernelKind, Pool, PoolConfig
from tests.pool.test_pool import (
    assert_cell_leaves_kernel_unclean,
    assert_reset_path,
    last,
    run,
    run_again_after_reset,
    settle,
    started,
)

__all__ = ["last"]  # the fixture, imported for the tests below

LIBRARIES = {
    "aliasing.py": (
        "import sys, types\n"
        "sys.modules[__name__ + '.compat'] = types.SimpleNamespace(value=1)\n"
        "sys.modules['aliasing_old_name'] = sys.modules[__name__]\n"
    ),
    "wrapping.py": (
        "import sys, types\n"
        "class _Wrapper(types.ModuleType):\n"
        "    pass\n"
        "_wrapper = _Wrapper(__name__)\n"
        "_wrapper.answer = 42\n"
        "sys.modules[__name__] = _wrapper\n"
    ),
    "uses_heavy.py": "import heavy_library\nfrom heavy_library import nn\n",
    "threaded.py": (
        "import threading, time\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "class Monitor(threading.Thread):\n"
        "    def __init__(self):\n"
        "        super().__init__(name='threaded-monitor', daemon=True)\n"
        "        self.stopped = threading.Event()\n"
        "    def run(self):\n"
        "        self.stopped.wait()\n"
        "class Progress:\n"
        "    monitor = None\n"
        "    def __init__(self):\n"
        "        if Progress.monitor is None:\n"
        "            Progress.monitor = Monitor()\n"
        "            Progress.monitor.start()\n"
        "_pool = None\n"
        "def pool_map(function, items):\n"
        "    global _pool\n"
        "    if _pool is None:\n"
        "        _pool = ThreadPoolExecutor(2, thread_name_prefix='threaded-pool')\n"
        "    return list(_pool.map(function, items))\n"
        "kept = []\n"
        "def in_background(function):\n"
        "    thread = threading.Thread(target=function, daemon=True)\n"
        "    kept.append(thread)\n"
        "    thread.start()\n"
        "def fire_and_forget(seconds):\n"
        "    threading.Thread(target=time.sleep, args=(seconds,), daemon=True).start()\n"
    ),
    # a library whose thread keeps changing what a reset walks: its own globals, loggers,
    # warning filters, and the namespace of a module a cell patches
    "churning.py": (
        "import logging, string, threading, warnings\n"
        "def _churn():\n"
        "    n = 0\n"
        "    while True:\n"
        "        n += 1\n"
        "        globals()[f'_cache_{n % 64}'] = n\n"
        "        globals().pop(f'_cache_{(n + 32) % 64}', None)\n"
        "        vars(string)[f'_churned_{n % 16}'] = n\n"
        "        logging.getLogger(f'churning.{n % 512}')\n"
        "        with warnings.catch_warnings():\n"
        "            warnings.simplefilter('ignore')\n"
        "class Worker:\n"
        "    thread = threading.Thread(target=_churn, name='churning', daemon=True)\n"
        "    thread.start()\n"
    ),
}


@pytest.fixture(scope="module")
def library_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("libraries")
    for name, source in LIBRARIES.items():
        (folder / name).write_text(source)
    return folder


@contextlib.asynccontextmanager
async def pool_importing_from(folder: Path) -> AsyncIterator[Pool]:
    """A one-kernel pool whose kernels import from ``folder`` (the preload puts it on
    ``sys.path``, part of the baseline)."""
    preload = f"import sys\nsys.path.insert(0, {str(folder)!r})\ndel sys"
    async with started(PoolConfig(size=1, kind=KernelKind(preload=preload))) as p:
        yield p


@pytest.fixture
async def pool(library_dir: Path) -> AsyncIterator[Pool]:
    async with pool_importing_from(library_dir) as p:
        yield p


async def _kept(pool: Pool, last: bool, first: str, then: str) -> str:
    """Run ``first`` as a lease's cell, then ``then`` on the same kernel: its stdout."""
    async with pool.lease() as lease:
        kernel = lease.kernel_id
        await run(lease, first, last=last)
    out = await run_again_after_reset(pool, kernel, then)
    assert_reset_path(pool, last)
    assert pool.stats().retirements["failed_reset"] == 0
    return out


# -- sys.modules -------------------------------------------------------------------------------


async def test_entries_the_import_system_did_not_make_are_removed(pool: Pool, last: bool) -> None:
    out = await _kept(
        pool,
        last,
        "import json, sys, types\nfrom unittest import mock\n"
        "sys.modules['made_here'] = types.ModuleType('made_here')\n"
        "sys.modules['json_again'] = json\n"
        "sys.modules['heavy_library'] = mock.MagicMock()\n"
        "sys.modules['blocked'] = None\nsys.modules['text'] = 'not a module'\n",
        "import sys\n"
        "names = ('made_here', 'json_again', 'heavy_library', 'blocked', 'text')\n"
        "print([name for name in names if name in sys.modules])",
    )
    assert out == "[]\n"


async def test_entries_a_cell_replaced_or_deleted_are_put_back(pool: Pool, last: bool) -> None:
    async with pool.lease() as lease:
        kernel = lease.kernel_id
        ids = await run(
            lease, "import colorsys, plistlib, json\nprint(id(colorsys), id(plistlib), id(json))"
        )
    out = await _kept(
        pool,
        last,
        "import sys\nfrom unittest import mock\n"
        "sys.modules['colorsys'] = mock.MagicMock()\n"
        "del sys.modules['plistlib']\nimport plistlib\n"  # imported anew in this request
        "sys.modules['json'] = 'replaced'\n",
        "import sys\nm = sys.modules\nprint(id(m['colorsys']), id(m['plistlib']), id(m['json']))",
    )
    assert out == ids
    assert (await _kernel_of(pool)) == kernel


async def _kernel_of(pool: Pool) -> str:
    async with pool.lease() as lease:
        return lease.kernel_id


async def test_modules_imported_under_a_stand_in_that_hold_it_are_imported_anew(
    pool: Pool, last: bool
) -> None:
    out = await _kept(
        pool,
        last,
        "import sys\nfrom unittest import mock\n"
        "sys.modules['heavy_library'] = mock.MagicMock()\n"
        "import uses_heavy, colorsys\n",
        "import sys\n"
        "print([n in sys.modules for n in ('heavy_library', 'uses_heavy', 'colorsys')])\n"
        "try:\n    import uses_heavy\nexcept ImportError as exc:\n    print(exc.name)\n",
    )
    assert out == "[False, False, True]\nheavy_library\n"


async def test_what_a_module_puts_in_sys_modules_as_it_is_imported_stays(
    pool: Pool, last: bool
) -> None:
    probe = (
        "import sys\nimport aliasing, wrapping\n"
        "names = ('aliasing', 'aliasing.compat', 'aliasing_old_name', 'wrapping')\n"
        "print([id(sys.modules.get(name)) for name in names], wrapping.answer)"
    )
    async with pool.lease() as lease:
        kernel = lease.kernel_id
        first = await run(lease, probe, last=last)
    assert "None" not in first
    assert await run_again_after_reset(pool, kernel, probe) == first  # the same objects
    assert pool.stats().retirements["failed_reset"] == 0


async def test_a_failed_import_shows_no_frame_of_the_kernel_machinery(pool: Pool) -> None:
    async with pool.lease() as lease:
        result = await lease.execute("import no_such_module_here", deadline=_soon())
    assert not result.ok
    traceback = "\n".join(
        line for o in result.outputs if o.msg_type == "error" for line in o.content["traceback"]
    )
    assert "No module named 'no_such_module_here'" in traceback
    assert "kernel_pool" not in traceback and "_find_and_load" not in traceback


def _soon() -> float:
    import time

    return time.monotonic() + 20


# -- threads and processes ---------------------------------------------------------------------


async def test_threads_a_library_keeps_are_warm_state(pool: Pool, last: bool) -> None:
    """A monitor kept as a class attribute and a module-wide pool, as tqdm's and dask's."""
    probe = (
        "import threading, threaded\n"
        "threaded.Progress()\n"
        "squares = threaded.pool_map(lambda x: x * x, range(8))\n"
        "print(sorted(t.name.split('_')[0] for t in threading.enumerate()"
        " if t.name.startswith('threaded')))"
    )
    out = await _kept(pool, last, probe, probe)
    assert out.startswith("['threaded-monitor', 'threaded-pool")


@pytest.mark.slow
async def test_a_library_changing_state_while_the_reset_walks_it(pool: Pool, last: bool) -> None:
    """Dictionaries and lists a reset walks change under it (another thread): every reset
    still completes, and the kernel is kept."""
    leases = 6
    for _ in range(leases):
        await _kept_quietly(pool, last, "import churning, string\nstring.ascii_letters = 'x'")
    assert pool.stats().retirements["failed_reset"] == 0
    out = await run_again_after_reset(
        pool, await _kernel_of(pool), "import string\nprint(string.ascii_letters[:3])"
    )
    assert out == "abc\n"
    assert_reset_path(pool, last, leases)


async def _kept_quietly(pool: Pool, last: bool, code: str) -> None:
    async with pool.lease() as lease:
        await run(lease, code, last=last)
    await settle(pool, idle=1)


async def test_a_thread_the_cell_started_retires_the_kernel_even_if_a_library_holds_it(
    pool: Pool, last: bool
) -> None:
    code = (
        "import threading, time, threaded\n"
        "thread = threading.Thread(target=time.sleep, args=(30,), daemon=True)\n"
        "thread.start()\nthreaded.kept.append(thread)\n"
    )
    await assert_cell_leaves_kernel_unclean(pool, code, last=last)


async def test_a_library_thread_running_a_cells_function_retires_the_kernel(
    pool: Pool, last: bool
) -> None:
    code = "import threaded, time\nthreaded.in_background(lambda: time.sleep(30))\n"
    await assert_cell_leaves_kernel_unclean(pool, code, last=last)


async def test_a_library_thread_nothing_keeps_retires_the_kernel(pool: Pool, last: bool) -> None:
    await assert_cell_leaves_kernel_unclean(
        pool, "import threaded\nthreaded.fire_and_forget(30)\n", last=last
    )


async def test_a_resource_tracker_is_warm_state(pool: Pool, last: bool) -> None:
    """multiprocessing's resource tracker lives as long as the interpreter and runs no cell
    code: the kernel that started it is kept."""
    code = (
        "from multiprocessing import resource_tracker, shared_memory\n"
        "block = shared_memory.SharedMemory(create=True, size=64)\n"
        "block.close()\nblock.unlink()\n"
        "print(resource_tracker._resource_tracker._pid is not None)"
    )
    assert await _kept(pool, last, code, code) == "True\n"


async def test_a_cells_thread_that_reuses_an_ended_baseline_threads_ident_retires_the_kernel(
    last: bool,
) -> None:
    """Thread idents are reused once a thread ends: the baseline holds the threads
    themselves, so a cell's thread cannot pass for one of them."""
    preload = (
        "import threading\n"
        "stop = threading.Event()\n"
        "waiter = threading.Thread(target=stop.wait, daemon=True)\n"
        "waiter.start()\n"
    )
    code = (
        "import threading, time\n"
        "ident = waiter.ident\nstop.set()\nwaiter.join()\n"
        "thread = threading.Thread(target=time.sleep, args=(30,), daemon=True)\n"
        "thread.start()\nprint(thread.ident == ident)\n"
    )
    # the per-kernel stage: threads cannot be forked from the template
    async with started(PoolConfig(size=1, kind=KernelKind(kernel_init=preload))) as pool:
        async with pool.lease() as lease:
            first = lease.kernel_id
            reused = await run(lease, code, last=last)
        if reused != "True\n":
            pytest.skip("this platform gave the new thread another ident")
        await settle(pool, idle=1)
        assert pool.stats().retirements["failed_reset"] == 1
        assert await _kernel_of(pool) != first
