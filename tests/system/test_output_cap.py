"""Console output is capped in the kernel, where it is printed, and bounded in the worker.

A cell that prints 1 GB (``print``, ``sys.stdout.write``, or a subprocess writing to file
descriptor 1) leaves the worker's RSS within twice the console cap above its idle RSS, and
``/health`` answers throughout; the bundle holds the first ``--console-cap`` characters and
the truncation marker with the exact count of the rest, per stream and per execution. A
cell that goes around the cap (a stream of its own, messages sent on the IOPub socket
itself) gets the same console, and the worker's memory stays bounded; a message over the
most the worker reads of one is never held, and its kernel is replaced.

Real kernels and a real worker over HTTP; the worker's RSS is sampled with psutil.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from bench.hostile import HealthWatch
from kernel_pool import STREAM_DROPPED_MSG_TYPE, Pool, PoolConfig
from kernel_worker.http.app import IOPUB_MESSAGE_BYTES
from kernel_worker.runs.console import truncation_marker
from tests.conftest import WorkerProcess, start_worker
from tests.pool.test_pool import stdout_of
from tests.wire import execute, read_bundle, run_ok

MIB = 1 << 20
CAP = 16 * MIB  # the default --console-cap
PRINTED = 1000 * MIB
PRINT_1GB = (
    "import sys\n"
    "chunk = 'x' * (8 << 20)\n"
    "for _ in range(125):\n"
    "    sys.stdout.write(chunk)\n"
    "del chunk\n"
)
SUBPROCESS_1GB = f"import os\nos.system('head -c {PRINTED} /dev/zero | tr \"\\\\0\" x')\n"
OWN_STREAM_1GB = (  # a stream of the cell's own in place of sys.stdout
    "import sys\n"
    "from ipykernel.iostream import OutStream\n"
    "kernel = get_ipython().kernel\n"
    "sys.stdout = OutStream(kernel.session, kernel.iopub_thread, 'stdout', watchfd=False)\n"
    "sys.stdout.set_parent(kernel.get_parent('shell'))\n"
    "chunk = 'x' * (8 << 20)\n"
    "for _ in range(125):\n"
    "    print(chunk, end='')\n"
    "sys.stdout.flush()\n"
    "del chunk, kernel\n"
)
IOPUB_MESSAGE = IOPUB_MESSAGE_BYTES - 4096  # characters: about the largest message read
IOPUB_1GB = (  # stream messages sent on the IOPub socket itself: the kernel's cap never sees them
    "kernel = get_ipython().kernel\n"
    "parent = kernel.get_parent('shell')\n"
    "from jupyter_client.session import Session\n"
    "own = Session(key=kernel.session.key, signature_scheme=kernel.session.signature_scheme)\n"
    f"content = {{'name': 'stdout', 'text': 'x' * {IOPUB_MESSAGE}}}\n"
    "for _ in range(1000):\n"
    "    own.send(kernel.iopub_socket, 'stream', content, parent=parent)\n"
    "del kernel, parent, content, own, Session\n"
)
IOPUB_OVERSIZED_1GB = (  # 125 messages of 8 MiB each on the IOPub socket: each over the limit
    "kernel = get_ipython().kernel\n"
    "parent = kernel.get_parent('shell')\n"
    "from jupyter_client.session import Session\n"
    "own = Session(key=kernel.session.key, signature_scheme=kernel.session.signature_scheme)\n"
    "content = {'name': 'stdout', 'text': 'x' * (8 << 20)}\n"
    "for _ in range(125):\n"
    "    own.send(kernel.iopub_socket, 'stream', content, parent=parent)\n"
    "del kernel, parent, content, own, Session\n"
)
SESSION_OF_ITS_OWN = (
    "kernel = get_ipython().kernel\n"
    "parent = kernel.get_parent('shell')\n"
    "from jupyter_client.session import Session\n"
    "own = Session(key=kernel.session.key, signature_scheme=kernel.session.signature_scheme)\n"
)
MANY_FRAMES = SESSION_OF_ITS_OWN + (  # one display_data of 400 buffers of 500 KiB: 200 MB
    "chunk = b'x' * (500 << 10)\n"
    "own.send(kernel.iopub_socket, 'display_data', {'data': {}, 'metadata': {}},\n"
    "         parent=parent, buffers=[chunk] * 400)\n"
    "del kernel, parent, own, Session, chunk\n"
)
SHELL_REPLIES = SESSION_OF_ITS_OWN + (  # four extra replies of 100 MiB on the shell socket
    "content = {'status': 'ok', 'pad': 'r' * (100 << 20)}\n"
    "for _ in range(4):\n"
    "    own.send(kernel.shell_stream.socket, 'execute_reply', content, parent=parent,\n"
    "             ident=kernel._parent_ident['shell'])\n"
    "del kernel, parent, own, Session, content\n"
)
PAYLOADS = (  # IPython's own way into execute_reply: three payloads of 50 MB
    "for _ in range(3):\n"
    "    get_ipython().payload_manager.write_payload(\n"
    "        {'source': 'page', 'data': {'text/plain': 'p' * (50 << 20)}})\n"
)
PID = "import os\nprint(os.getpid())\n"


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """One kernel (so consecutive cells share it), the default console cap."""
    worker = start_worker(tmp_path_factory, "--pool-size", "1")
    yield worker
    worker.stop()


def _watched(worker: WorkerProcess, source: str) -> tuple[httpx.Response, int, list[int]]:
    """The cell's answer, the worker's peak RSS above idle while it ran, and every /health
    status asked meanwhile."""
    with httpx.Client(base_url=worker.url, timeout=300) as client:
        for _ in range(2):  # warm the kernel, the connection and the bundle path
            run_ok(client, "print('warm')")
        watch = HealthWatch(worker.url, worker.proc.pid, sample_seconds=0.002)
        idle = watch.idle_rss()
        with watch:
            response = execute(client, source)
            time.sleep(0.1)  # and a moment after the answer
    return response, watch.sampled_peak - idle, watch.answers


def _run_watched(worker: WorkerProcess, source: str) -> tuple[str, int, list[int]]:
    response, growth, answers = _watched(worker, source)
    bundle = read_bundle(response)
    assert bundle.manifest["success"], bundle.manifest
    return bundle.stdout(), growth, answers


def _assert_bounded(growth: int, answers: list[int]) -> None:
    assert growth <= 2 * CAP, f"the worker grew {growth / MIB:.1f} MiB above idle"
    assert answers and all(status == 200 for status in answers), answers


def _assert_capped_and_bounded(
    stdout: str, growth: int, answers: list[int], printed: int = PRINTED
) -> None:
    assert len(stdout) == CAP + len(truncation_marker(printed - CAP))
    assert stdout.endswith(truncation_marker(printed - CAP))
    assert stdout[:CAP] == "x" * CAP
    _assert_bounded(growth, answers)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("source", [PRINT_1GB, SUBPROCESS_1GB], ids=["print", "subprocess"])
def test_printing_1_gb_keeps_the_worker_within_twice_the_cap(
    solo: WorkerProcess, source: str
) -> None:
    _assert_capped_and_bounded(*_run_watched(solo, source))


@pytest.mark.timeout(300)
def test_a_stream_of_the_cells_own_is_capped_too(solo: WorkerProcess) -> None:
    _assert_capped_and_bounded(*_run_watched(solo, OWN_STREAM_1GB))


@pytest.mark.timeout(300)
def test_a_kernel_that_goes_around_the_cap_still_gets_a_bounded_worker(
    solo: WorkerProcess,
) -> None:
    """What the kernel sends past the cap is read and dropped as it comes: the console is
    the same, and the worker holds the kept text plus a few messages not yet read."""
    _assert_capped_and_bounded(*_run_watched(solo, IOPUB_1GB), printed=1000 * IOPUB_MESSAGE)


def _pid(worker: WorkerProcess) -> int:
    with httpx.Client(base_url=worker.url, timeout=120) as client:
        return int(run_ok(client, PID).stdout())


@pytest.mark.timeout(300)
def test_messages_over_the_limit_are_never_held_and_the_kernel_is_replaced(
    solo: WorkerProcess,
) -> None:
    """A message larger than the worker reads (512 KiB) is dropped as its size arrives: the
    worker holds none of the 8 MiB messages, the cell ends with a note of what was lost
    (or, when the kernel's idle status was lost with them, as a replaced kernel), and the
    kernel that sent them is not used again."""
    before = _pid(solo)
    response, growth, answers = _watched(solo, IOPUB_OVERSIZED_1GB)
    _assert_bounded(growth, answers)
    if response.status_code == 200:
        bundle = read_bundle(response)
        assert bundle.manifest["success"], bundle.manifest
        assert f"a message of more than {IOPUB_MESSAGE_BYTES} bytes" in bundle.stderr()
        assert bundle.stderr().count("outputs of this cell were lost") == 1
        assert bundle.stdout() == ""
    else:
        assert "stopped answering" in response.text, (response.status_code, response.text)
    assert _pid(solo) != before


def test_large_legit_output_arrives_whole_on_the_same_kernel(solo: WorkerProcess) -> None:
    """What the agent publishes stays under the limit: 3 MiB of text that JSON escapes six
    times over, a 3 MiB display and a 3 MiB result all arrive intact, and the kernel is
    kept."""
    before = _pid(solo)
    with httpx.Client(base_url=solo.url, timeout=120) as client:
        bundle = run_ok(
            client,
            "import sys\nfrom IPython.display import HTML, display\n"
            "sys.stdout.write('\\x01' * (3 << 20))\n"
            "display(HTML('<p>' + 'h' * (3 << 20) + '</p>'))\n"
            "'r' * (3 << 20)\n",
        )
    assert bundle.stdout() == "\x01" * (3 * MIB)
    assert "lost" not in bundle.stderr()
    sizes = {(d["content_type"], d["bytes"]) for d in bundle.manifest["display"]}
    assert ("text/html", 3 * MIB + len("<p></p>")) in sizes, sizes
    assert ("text/plain", 3 * MIB + len("''")) in sizes, sizes  # the result's repr
    assert _pid(solo) == before


def test_an_ordinary_cells_oversized_message_is_cut_in_the_kernel(solo: WorkerProcess) -> None:
    """Messages the kernel itself would send over the limit (an exception with a 2 MB value,
    a display with 1 MB of metadata, a widget's comm state) are cut where they are sent, so
    the cell gets its answer, nothing is lost and the kernel is kept."""
    before = _pid(solo)
    with httpx.Client(base_url=solo.url, timeout=120) as client:
        failed = execute(client, "raise ValueError('v' * 2_000_000 + 'END')")
        shown = run_ok(
            client,
            "from IPython.display import display\n"
            "display({'text/plain': 'small'}, metadata={'m': 'x' * 1_000_000}, raw=True)\n"
            "from ipykernel.comm import Comm\n"
            "Comm(target_name='t', data={'state': 'c' * 1_000_000}).close()\n"
            "print('after')\n",
        )
    error = read_bundle(failed).manifest["error"]
    assert error.startswith("vvv") and error.endswith("END"), error[-200:]
    assert "characters not kept: one message may hold at most" in error
    assert len(error) < IOPUB_MESSAGE_BYTES
    assert shown.stdout() == "after\n" and "lost" not in shown.stderr()
    assert _pid(solo) == before


def test_forked_childrens_output_arrives_and_no_port_is_left_open(solo: WorkerProcess) -> None:
    """A forked child's prints (os.fork, a multiprocessing fork pool) arrive through the
    descriptor it inherited, not ipykernel's loopback port, which any local user could
    connect to: the kernel listens on no TCP port."""
    source = (
        "import os, sys, multiprocessing as mp\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print('child out'); sys.stderr.write('child err\\n'); os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "def f(x):\n"
        "    print('pool', x, flush=True)\n"
        "    return x\n"
        "with mp.get_context('fork').Pool(2) as pool:\n"
        "    pool.map(f, range(3))\n"
    )
    with httpx.Client(base_url=solo.url, timeout=120) as client:
        bundle = run_ok(client, source)
    assert sorted(bundle.stdout().splitlines()) == ["child out", "pool 0", "pool 1", "pool 2"]
    assert bundle.stderr() == "child err\n"
    for kernel in psutil.Process(solo.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            listening = [c for c in kernel.net_connections("inet") if c.status == "LISTEN"]
            assert listening == [], (kernel.cmdline(), listening)


def test_the_cap_is_per_stream_and_per_execution(solo: WorkerProcess) -> None:
    with httpx.Client(base_url=solo.url, timeout=120) as client:
        bundle = run_ok(
            client,
            "import sys\n"
            f"sys.stdout.write('o' * {CAP - 3})\nprint('abcdef')\n"  # the cut falls mid-write
            f"sys.stderr.write('e' * {CAP + 20})\n"
            "import os\nos.system('echo from-a-subprocess')\n",  # past the cap: dropped
        )
        assert bundle.stdout() == "o" * (CAP - 3) + "abc" + truncation_marker(4 + 18)
        assert bundle.stderr() == "e" * CAP + truncation_marker(20)
        # the next cell on the same kernel starts from a full allowance
        again = run_ok(client, "import os, sys\nprint('short')\nos.system('echo fd')\n")
        assert again.stdout() == "short\nfd\n"
        assert again.stderr() == ""


async def test_the_kernel_publishes_at_most_the_cap_in_small_messages() -> None:
    """At the pool: past ``stream_cap`` the kernel sends nothing more and one report of
    what it dropped; nothing it published is a large message, and IPython kept no copy."""
    code = "import sys\nfor _ in range(40):\n    sys.stdout.write('y' * (1 << 20))\n"
    async with Pool(PoolConfig(size=1)) as pool, pool.lease() as lease:
        capped = await lease.execute(code, deadline=time.monotonic() + 60, stream_cap=3 * MIB)
        streams = [o for o in capped.outputs if o.msg_type == "stream"]
        assert stdout_of(capped) == "y" * 3 * MIB
        assert max(len(o.content["text"]) for o in streams) <= MIB
        dropped = [o.content for o in capped.outputs if o.msg_type == STREAM_DROPPED_MSG_TYPE]
        assert dropped == [{"stdout": 37 * MIB}]
        uncapped = await lease.execute(
            "print('z' * 100)\nprint(len(get_ipython().history_manager.outputs))",
            deadline=time.monotonic() + 60,
        )
        assert stdout_of(uncapped) == "z" * 100 + "\n0\n"
        assert not [o for o in uncapped.outputs if o.msg_type == STREAM_DROPPED_MSG_TYPE]


def _assert_within_64_mib(growth: int, answers: list[int]) -> None:
    assert growth <= 64 * MIB, f"the worker grew {growth / MIB:.1f} MiB above idle"
    assert answers and all(status == 200 for status in answers), answers


@pytest.mark.timeout(300)
@pytest.mark.parametrize("source", [MANY_FRAMES, SHELL_REPLIES], ids=["frames", "shell"])
def test_a_message_over_the_limit_is_never_held_however_it_is_sent(
    solo: WorkerProcess, source: str
) -> None:
    """A message is bounded by its bytes as its frames arrive, on the shell socket as on
    IOPub: 400 buffers of 500 KiB (each frame under the limit) or replies of 100 MiB are
    skipped as they come, the worker stays within 64 MiB of idle, and the kernel that sent
    them is replaced."""
    before = _pid(solo)
    response, growth, answers = _watched(solo, source)
    _assert_within_64_mib(growth, answers)
    if response.status_code == 200:
        bundle = read_bundle(response)
        assert f"a message of more than {IOPUB_MESSAGE_BYTES} bytes" in bundle.stderr()
    else:
        assert "stopped answering" in response.text, (response.status_code, response.text)
    assert _pid(solo) != before


@pytest.mark.timeout(300)
def test_payloads_are_cut_in_the_kernel(solo: WorkerProcess) -> None:
    """Payloads IPython puts in ``execute_reply`` (150 MB here) are cut where the reply is
    sent: the cell succeeds, the worker stays within 64 MiB of idle, the kernel is kept."""
    before = _pid(solo)
    response, growth, answers = _watched(solo, PAYLOADS)
    _assert_within_64_mib(growth, answers)
    assert read_bundle(response).manifest["success"]
    assert _pid(solo) == before
