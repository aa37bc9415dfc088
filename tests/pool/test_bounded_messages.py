"""What a kernel sends that nobody awaits is not kept, and what it sends is cut to size in it.

Real kernels, hostile cells written as cells. A cell sends replies nobody asked for on
the kernel's shell socket after it has answered (from a callback it left on the kernel's
event loop), while the lease sits
between requests (nobody reads the kernel's queue then): the pool drops them as they
arrive, where it queued them until a later request drained them. And a comm message with
buffers that take it over the message cap goes without them (the in-kernel cut counts
buffers), where the pool dropped the whole message and replaced the kernel.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import psutil
import pytest

from kernel_pool import Pool, PoolConfig
from tests.pool.test_pool import stdout_of

MIB = 1 << 20
CAP = 512 << 10  # the worker's max_iopub_message


def _late_replies(done: Path) -> str:
    """A cell that leaves a callback on the kernel's event loop: once the cell has
    answered, it sends 400 replies of 400 KiB (160 MB) for a request that does not exist,
    then writes to the FIFO ``done``."""
    return (
        "import asyncio\n"
        "kernel = get_ipython().kernel\n"
        "from jupyter_client.session import Session\n"
        "own = Session(key=kernel.session.key, signature_scheme=kernel.session.signature_scheme)\n"
        "def _send(ident=kernel._parent_ident['shell'], sock=kernel.shell_stream.socket):\n"
        "    content = {'status': 'ok', 'pad': 'r' * (400 << 10)}\n"
        "    for _ in range(400):\n"
        "        own.send(sock, 'execute_reply', content, parent={'msg_id': 'nobody'}, ident=ident)\n"
        f"    with open({str(done)!r}, 'w') as fh:\n"
        "        fh.write('sent')\n"
        "asyncio.get_running_loop().call_later(0.2, _send)\n"
    )


@pytest.mark.slow
async def test_replies_nobody_waits_for_are_dropped_as_they_arrive(tmp_path: Path) -> None:
    done = tmp_path / "done"
    os.mkfifo(done)
    me = psutil.Process()
    async with Pool(PoolConfig(size=1, max_iopub_message=CAP)) as pool, pool.lease() as lease:
        await lease.execute("pass", deadline=time.monotonic() + 30)
        idle = me.memory_info().rss
        answered = await lease.execute(_late_replies(done), deadline=time.monotonic() + 30)
        assert answered.ok, answered.reply
        # the event loop runs (and reads the kernel) while the thread sends
        assert await asyncio.to_thread(done.read_text) == "sent"
        held = me.memory_info().rss - idle
        assert held < 64 * MIB, f"{held / MIB:.0f} MiB held for replies nobody waits for"
        after = await lease.execute("print('next')", deadline=time.monotonic() + 30)
        assert stdout_of(after) == "next\n"


async def test_a_comm_message_over_the_cap_with_its_buffers_goes_without_them() -> None:
    """Each buffer is under the cap, together they are over it: the message is sent
    without them (its data cut), nothing is lost and the kernel is kept."""
    code = (
        "from comm import create_comm\n"
        "create_comm(target_name='t', data={'n': 1}, buffers=[b'b' * (300 << 10)] * 3).close()\n"
        "print('after')\n"
    )
    async with Pool(PoolConfig(size=1, max_iopub_message=CAP)) as pool:
        async with pool.lease() as lease:
            pid = lease.pid
            result = await lease.execute(code, deadline=time.monotonic() + 30)
        assert result.ok, result.reply
        assert stdout_of(result) == "after\n"
        opened = [o for o in result.outputs if o.msg_type == "comm_open"]
        assert [(o.content["data"], o.buffers) for o in opened] == [({}, ())]
        async with pool.lease() as lease:
            assert lease.pid == pid
