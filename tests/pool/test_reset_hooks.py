"""Process-wide hooks no reset can take back retire the kernel (real kernels, both reset
paths): an audit hook (it would see the source of every later request's cells), an at-fork
callback a cell registered. One a module registers as it is imported stays, as the module
does. (The hooks a reset does undo are carry-over cases in ``test_reset_state.py``.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernel_pool import Pool
from tests.pool.test_pool import assert_cell_leaves_kernel_unclean, last, run_again_after_reset
from tests.pool.test_reset_imports import pool_importing_from

__all__ = ["last"]  # the fixture, imported for the tests below


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[Pool]:
    (tmp_path / "forking_library.py").write_text(
        "import os\nchildren = []\nos.register_at_fork(after_in_child=lambda: children.append(1))\n"
    )
    async with pool_importing_from(tmp_path) as p:
        yield p


async def test_an_audit_hook_retires_the_kernel(pool: Pool, last: bool) -> None:
    code = "import sys\nsys.addaudithook(lambda event, args: None)"
    await assert_cell_leaves_kernel_unclean(pool, code, last=last)


async def test_an_audit_hook_added_through_c_retires_the_kernel(pool: Pool, last: bool) -> None:
    code = (
        "import ctypes\n"
        "HOOK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.py_object, ctypes.c_void_p)\n"
        "hook = HOOK(lambda event, args, data: 0)\n"
        "ctypes.pythonapi.PySys_AddAuditHook(hook, None)\n"
        "import sys; sys._kernel_pool_test_hook = hook\n"
    )
    await assert_cell_leaves_kernel_unclean(pool, code, last=last)


async def test_an_at_fork_callback_a_cell_registers_retires_the_kernel(
    pool: Pool, last: bool
) -> None:
    code = "import os\nos.register_at_fork(after_in_child=lambda: print('forked'))"
    await assert_cell_leaves_kernel_unclean(pool, code, last=last)


async def test_an_at_fork_callback_registered_on_import_stays(pool: Pool, last: bool) -> None:
    async with pool.lease() as lease:
        kernel = lease.kernel_id
        await lease.execute("import forking_library", deadline=_soon(), last=last)
    out = await run_again_after_reset(
        pool, kernel, "import forking_library\nprint(len(forking_library.children))"
    )
    assert out == "0\n"
    assert pool.stats().retirements["failed_reset"] == 0


def _soon() -> float:
    import time

    return time.monotonic() + 20
