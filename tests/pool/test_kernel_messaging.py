"""What a pool kernel publishes per execution: what the pool reads, nothing for absent clients.

A second subscriber on the kernel's IOPub socket sees exactly what the pool is sent.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from jupyter_client.blocking import BlockingKernelClient

from kernel_pool import KernelKind, Lease, Output, Pool, PoolConfig
from tests.markers import full_run_only
from tests.pool.test_pool import stdout_of


@pytest.fixture(params=[True, full_run_only(False)], ids=["forked", "spawned"])
def fork_server(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


class IOPubListener:
    """A SUB socket on a leased kernel's IOPub, connected before any cell under test."""

    def __init__(self, lease: Lease) -> None:
        self.client = BlockingKernelClient()
        self.client.load_connection_info(dict(lease._kernel._process.connection_info))
        self.client.start_channels(shell=False, iopub=True, stdin=False, hb=False, control=False)

    def messages_of(self, msg_id: str, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Every message published for request ``msg_id``, up to its idle status."""
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.client.get_iopub_msg(timeout=0.2)
            except Exception:  # queue.Empty: nothing yet
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            seen.append(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return seen
        raise AssertionError(f"no idle status for {msg_id} within {timeout}s: {seen}")

    def close(self) -> None:
        self.client.stop_channels()


async def _subscribed(lease: Lease) -> IOPubListener:
    """A listener that has provably joined: it saw a probe cell's idle status."""
    listener = IOPubListener(lease)
    for _ in range(50):
        probe = await lease.execute("pass", deadline=time.monotonic() + 10)
        try:
            listener.messages_of(probe.msg_id, timeout=0.5)
            return listener
        except AssertionError:
            continue
    listener.close()
    raise AssertionError("the IOPub subscriber never joined")


@pytest.fixture
async def leased(fork_server: bool) -> AsyncIterator[tuple[Lease, IOPubListener]]:
    async with (
        Pool(PoolConfig(size=1, kind=KernelKind(fork=fork_server))) as pool,
        pool.lease() as lease,
    ):
        listener = await _subscribed(lease)
        try:
            yield lease, listener
        finally:
            listener.close()


async def test_an_execution_publishes_its_outputs_and_idle_only(
    leased: tuple[Lease, IOPubListener],
) -> None:
    lease, listener = leased
    result = await lease.execute("print('hi')\n6 * 7", deadline=time.monotonic() + 10)
    assert result.ok, result.reply
    kinds = [m["msg_type"] for m in listener.messages_of(result.msg_id)]
    # no execute_input echo of the code and no busy status: the pool, the only client,
    # reads neither
    assert kinds == ["stream", "execute_result", "status"], kinds
    assert stdout_of(result) == "hi\n"


async def test_output_left_in_the_buffer_arrives_before_idle(
    leased: tuple[Lease, IOPubListener],
) -> None:
    """A quiet flush is skipped; one with output pending is not, whoever wrote it."""
    lease, _listener = leased
    quiet = await lease.execute("x = 1", deadline=time.monotonic() + 10)
    assert quiet.ok and stdout_of(quiet) == ""
    code = (
        "import sys, threading\n"
        "sys.stdout.write('no newline')\n"
        "t = threading.Thread(target=lambda: sys.stderr.write('from a thread'))\n"
        "t.start(); t.join()\n"
        "sys.stdout.flush()\n"
        "sys.stdout.write(' and after the flush');"
    )
    for _ in range(3):  # each time: nothing is held back for a later flush
        result = await lease.execute(code, deadline=time.monotonic() + 10)
        assert result.ok, result.reply
        streams = [
            (o.content["name"], o.content["text"]) for o in result.outputs if o.msg_type == "stream"
        ]
        assert "".join(t for n, t in streams if n == "stdout") == "no newline and after the flush"
        assert "".join(t for n, t in streams if n == "stderr") == "from a thread"


async def test_a_kernel_builds_no_debug_records_but_still_warns(
    leased: tuple[Lease, IOPubListener],
) -> None:
    """Its log takes the level its handlers print at (a stock kernel's is DEBUG)."""
    lease, _listener = leased
    code = (
        "import logging\n"
        "log = get_ipython().kernel.log\n"
        "print(log.isEnabledFor(logging.DEBUG), log.isEnabledFor(logging.WARNING))"
    )
    result = await lease.execute(code, deadline=time.monotonic() + 10)
    assert stdout_of(result) == "False True\n"


async def test_a_replaced_runner_is_called_as_its_own_signature_allows(
    leased: tuple[Lease, IOPubListener],
) -> None:
    """ipykernel's per-execution signature check is remembered per function, not per name:
    a narrower ``run_cell_async`` put in place by a cell is called without ``cell_id``."""
    lease, _listener = leased
    awaiting = "import asyncio\nawait asyncio.sleep(0)\nprint('{}')"  # run by run_cell_async
    first = await lease.execute(awaiting.format("before"), deadline=time.monotonic() + 10)
    assert stdout_of(first) == "before\n"
    replace = (
        "shell = get_ipython()\n"
        "original = shell.run_cell_async\n"
        "async def narrow(raw_cell, store_history=False, silent=False, shell_futures=True,\n"
        "                 *, transformed_cell=None, preprocessing_exc_tuple=None):\n"
        "    print('narrow')\n"
        "    return await original(raw_cell, store_history, silent, shell_futures,\n"
        "        transformed_cell=transformed_cell, preprocessing_exc_tuple=preprocessing_exc_tuple)\n"
        "shell.run_cell_async = narrow"
    )
    assert (await lease.execute(replace, deadline=time.monotonic() + 10)).ok
    after = await lease.execute(awaiting.format("after"), deadline=time.monotonic() + 10)
    assert after.ok, after.reply
    assert stdout_of(after) == "narrow\nafter\n"
    undo = "import asyncio\nawait asyncio.sleep(0)\ndel get_ipython().run_cell_async"
    assert (await lease.execute(undo, deadline=time.monotonic() + 10)).ok


async def test_cells_are_named_without_hashing_their_text_in_python(
    leased: tuple[Lease, IOPubListener],
) -> None:
    """ipykernel's pure-Python murmur2 is not run on a cell's text (1.4 ms per 10 KB, on
    every execution); names keep their form: a file in the kernel's temporary folder, the
    same for the same text, another for another text."""
    lease, _listener = leased
    count_calls = (
        "import ipykernel.compiler as compiler\n"
        "murmur_calls = []\n"
        "_murmur = compiler.murmur2_x86\n"
        "compiler.murmur2_x86 = lambda *a: murmur_calls.append(1) or _murmur(*a)\n"
    )
    assert (await lease.execute(count_calls, deadline=time.monotonic() + 10)).ok
    define = "def f():\n    pass\n" + "# a long cell\n" * 2000
    names = []
    for source in (define, define, define + "# another text\n"):
        result = await lease.execute(
            source + "print(f.__code__.co_filename)", deadline=time.monotonic() + 10
        )
        assert result.ok, result.reply
        names.append(stdout_of(result).strip())
    folder = await lease.execute(
        "print(compiler.get_tmp_directory(), len(murmur_calls))", deadline=time.monotonic() + 10
    )
    tmp, calls = stdout_of(folder).split()
    assert calls == "0"
    assert names[0] == names[1] != names[2], names
    assert all(n.startswith(tmp) and n.endswith(".py") for n in names), (tmp, names)


@pytest.mark.slow
async def test_output_a_send_under_way_holds_is_not_overtaken_by_idle(
    leased: tuple[Lease, IOPubListener],
) -> None:
    """The IO thread's timed send (every 0.2 s) takes the buffered output, then encodes it:
    a cell ending meanwhile must not have its idle status sent ahead of that output (the
    pool stops reading at idle). The pauses put the cell's end around the timed send."""
    lease, _listener = leased
    for i in range(18):
        pause = 0.196 + (i % 9) * 0.001
        cell = f"import sys, time\nsys.stdout.write('x' * 4_000_000)\ntime.sleep({pause})"
        result = await lease.execute(cell, deadline=time.monotonic() + 20)
        assert result.ok, result.reply
        assert len(stdout_of(result)) == 4_000_000, f"pause {pause}"


async def test_output_of_a_subprocess_reaches_the_cell_that_ran_it(fork_server: bool) -> None:
    """File-descriptor output passes through a thread of the kernel, which reads the pipe and
    hands what it read on: the cell's reply waits for it. Here the thread takes 50 ms to
    hand the second echo on (as on a busy machine); the first one puts it on that path."""
    cell = (
        "import os, sys, time\n"
        "plain_read = os.read\n"
        "def late_read(fd, n):\n"
        "    data = plain_read(fd, n)\n"
        "    if fd == sys.stdout._fid and b'late' in data:\n"
        "        time.sleep(0.05)\n"
        "    return data\n"
        "os.read = late_read\n"
        "os.system('echo first')\n"
        "time.sleep(0.05)\n"
        "os.system('echo late')\n"
    )
    # ipykernel captures no descriptor output under pytest (it looks for this variable)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    config = PoolConfig(size=1, env=env, kind=KernelKind(fork=fork_server))
    async with Pool(config) as pool, pool.lease() as lease:
        for _ in range(3):
            result = await lease.execute(cell, deadline=time.monotonic() + 10)
            assert result.ok, result.reply
            assert stdout_of(result) == "first\nlate\n"


def _shell_channel_thread_name() -> str:
    """The name ipykernel gives the thread that reads shell requests (ipykernel 7)."""
    thread_module = pytest.importorskip("ipykernel.thread")
    name = getattr(thread_module, "SHELL_CHANNEL_THREAD_NAME", None)
    if name is None:
        pytest.skip("this ipykernel reads shell requests on its main thread already")
    return str(name)


async def test_forked_kernels_read_shell_requests_on_the_main_thread(
    leased: tuple[Lease, IOPubListener], fork_server: bool
) -> None:
    """ipykernel 7 reads shell requests in a thread of its own (to route them to subshells,
    which the pool never opens) and hands each request and reply across: forked kernels
    read them on the main thread and announce no subshells. Spawned kernels are stock."""
    name = _shell_channel_thread_name()
    lease, _listener = leased
    probe = (
        "import threading\n"
        "kernel = get_ipython().kernel\n"
        f"print([t.name for t in threading.enumerate() if t.name == {name!r}],"
        " kernel._supports_kernel_subshells, threading.current_thread().name)"
    )
    result = await lease.execute(probe, deadline=time.monotonic() + 10)
    assert result.ok, result.reply
    if fork_server:
        assert stdout_of(result) == "[] False MainThread\n"
    else:
        assert stdout_of(result) == f"[{name!r}] True MainThread\n"


async def test_an_interrupted_async_cell_is_cancelled_and_the_kernel_goes_on(
    leased: tuple[Lease, IOPubListener],
) -> None:
    """An async cell's interrupt takes the path ipykernel picks by comparing the current
    thread with the shell-channel thread's parent: the cell's coroutine is cancelled. (As
    in a stock kernel, the signal is handled when the event loop next wakes: here, when
    the sleep ends.)"""
    lease, _listener = leased
    printed: list[str] = []
    started = asyncio.Event()

    def on_output(output: Output) -> None:
        if output.msg_type == "stream":
            printed.append(str(output.content.get("text")))
            started.set()

    cell = "import asyncio\nprint('waiting', flush=True)\nawait asyncio.sleep(1.5)\nprint('woke')"
    running = asyncio.ensure_future(
        lease.execute(cell, deadline=time.monotonic() + 30, on_output=on_output)
    )
    await asyncio.wait_for(started.wait(), 10)
    await lease.interrupt()
    result = await running
    assert not result.ok
    assert result.reply.get("ename") in ("CancelledError", "KeyboardInterrupt"), result.reply
    assert "".join(printed) == "waiting\n"
    after = await lease.execute("print('still here')", deadline=time.monotonic() + 10)
    assert after.ok, after.reply
    assert stdout_of(after) == "still here\n"
