"""``kernel_uids``: releasing a retired kernel's uid never reaches the next kernel of it.

A kernel is killed twice when a cell times out: by the timeout (inline), then by its
retirement. Each kill used to kill every process of the kernel's uid again; by the second,
the uid could already run a new kernel, which was killed during its start (exit -9). A
kernel's uid is released once (its processes killed, what it left removed), while the
pool still counts the uid as that kernel's. Needs root and an interpreter any uid can
run; elsewhere it is skipped, saying why.
"""

from __future__ import annotations

import pytest

from kernel_pool import Pool, PoolConfig, RecyclePolicy
from tests.conftest import kernel_uid_unavailable
from tests.pool.test_pool import run

UID = 33100  # apart from the other uid tests' ranges
_WHY_NOT = kernel_uid_unavailable(UID)
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT))


async def test_killing_a_retired_kernel_again_spares_the_next_kernel_of_its_uid() -> None:
    config = PoolConfig(size=1, kernel_uids=(UID, UID + 1), recycle=RecyclePolicy.FRESH)
    async with Pool(config) as pool:
        async with pool.lease() as lease:
            first = lease._kernel  # retired (and torn down) when the lease ends
            uid = first.own_uid
        for _ in range(3):  # a later kernel gets that uid again
            async with pool.lease() as lease:
                if lease.identity is None or lease.identity[0] != uid:
                    continue
                await first.kill()  # as a retirement after a timeout's kill does
                assert await run(lease, "import os\nprint(os.getuid())") == f"{uid}\n"
                assert first.died.is_set() and lease.pid is not None
                break
        else:
            pytest.fail(f"no later kernel ran as uid {uid}")
