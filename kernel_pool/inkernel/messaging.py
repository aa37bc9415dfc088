"""What a kernel publishes, and when: nothing for clients it never has, and nothing lost.

- :func:`lean_messaging` (run once, with the baseline) drops per-request work a stock
  kernel does for clients the pool's kernels never have, and makes sure what the cell
  printed is sent before the kernel's idle status.
- :func:`drain_fd_output` (after each execution) waits for output the cell's subprocesses
  wrote. With ``capture_fd_output``, ipykernel points file descriptors 1 and 2 at pipes
  and a thread per pipe forwards what arrives (a subprocess's output, a C library's
  ``printf``) to the cell's stdout or stderr. Nothing waited for that thread: when the cell
  ended before it had passed the last bytes on (about 1 request in 200 that ran
  ``os.system('echo …')``, more on a busy machine), they reached IOPub after the reply,
  under a request that was over, and were lost. It waits until each pipe is empty and its
  thread is back to reading it.
- The pool answers a request when it has both the reply and the idle status, so neither
  waits: :func:`_reply_at_once` sends the reply when the handler returns, and
  :func:`reset_after_idle` starts the reset after a lease's last cell only once the IO
  thread has sent the idle status (it waited for the GIL while the reset held it, a
  millisecond or more).
- How much of a cell's stdout and stderr is published at most (a cap per stream and
  request, counted past it, fd-level output included) is ``streams``', set up
  by :func:`lean_messaging` too.
- :func:`before_kernel_app` (in a forked kernel, before ipykernel's application starts)
  keeps colours from being forced on the cells' processes, and has the main thread read
  shell requests itself. ipykernel 7 reads them in a thread of
  their own, to route them to subshells, and hands each request and each reply between the
  two threads: two thread hand-offs per request, ~0.5 ms of CPU and a tenth of a trivial
  cell's round trip on a 2-core machine. The pool never opens a subshell.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import functools
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .baseline import get_shell
from .sizes import cap_messages
from .streams import cap_streams

_DRAIN_SECONDS = 0.5  # at most, per stream: a thread starved that long is left behind
_FIONREAD = 0x541B  # Linux, every architecture Python runs on
_POLLOUT = 2  # zmq.POLLOUT


def drain_fd_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        pipe = getattr(stream, "_fid", None)
        thread = getattr(stream, "watch_fd_thread", None)
        if pipe is None or thread is None or not getattr(stream, "_should_watch", False):
            continue
        deadline = time.monotonic() + _DRAIN_SECONDS
        while thread.is_alive() and not _passed_on(pipe, stream, thread):
            if time.monotonic() > deadline:
                break
            time.sleep(0.0002)  # the thread needs the GIL to pass the bytes on


def _passed_on(pipe: Any, stream: Any, thread: Any) -> Any:
    """Whether every byte written to ``pipe`` so far has been handed to ``stream``: the pipe
    is empty and the thread is blocked reading it (or echoing the last bytes it passed on
    to the original descriptor), not holding bytes it has read but not yet written."""
    try:
        pending = array.array("i", [0])
        fcntl.ioctl(pipe, _FIONREAD, pending)
        if pending[0]:
            return False
        fd = os.open(f"/proc/self/task/{thread.native_id}/syscall", os.O_RDONLY)
        try:
            fields = os.read(fd, 128).split()
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return True  # cannot tell (not Linux, no /proc): as ipykernel itself, do not wait
    if len(fields) < 2 or fields[0] == b"running":
        return False
    try:
        first_argument = int(fields[1], 16)
    except ValueError:
        return True
    return first_argument in (pipe, getattr(stream, "_original_stdstream_copy", None))


def before_kernel_app() -> None:
    """Prepare ipykernel in a forked kernel before its application starts."""
    _plain_environment()
    _no_shell_channel_thread()


def _plain_environment() -> None:
    """Keep ipykernel from forcing colours on what the cells' processes print.

    For a notebook frontend it sets ``TERM=xterm-color``, ``CLICOLOR``, ``FORCE_COLOR`` and
    ``CLICOLOR_FORCE``: pip, pytest or rich run by a cell then wrote ANSI escapes into the
    output, which here is plain text, as in the reference's cell process. Its pager settings
    (``PAGER``/``GIT_PAGER=cat``) stay: nothing here can answer a pager.
    """
    try:
        from ipykernel.zmqshell import ZMQInteractiveShell
    except ImportError:
        return

    def init_environment(self: Any) -> None:
        os.environ["PAGER"] = "cat"
        os.environ["GIT_PAGER"] = "cat"

    ZMQInteractiveShell.init_environment = init_environment  # type: ignore[method-assign]


def _no_shell_channel_thread() -> None:
    """Keep ipykernel 7's shell-channel thread from starting in this kernel.

    Its application creates the thread with the sockets; the kernel then reads the shell
    socket on the main thread, as ipykernel 6 did, and announces no subshells (the
    application and the kernel test the thread for truth, or for ``None``). One line of
    ipykernel reads ``parent_thread`` from it unguarded (an async cell's interrupt), so a
    false stand-in takes its place rather than ``None``. Versions without the thread, or
    with another shape, are left as they are.
    """
    try:
        from ipykernel.kernelapp import IPKernelApp
        from ipykernel.kernelbase import Kernel
    except ImportError:
        return
    init_sockets = getattr(IPKernelApp, "init_sockets", None)
    if not isinstance(getattr(Kernel, "_supports_kernel_subshells", None), property) or not (
        callable(init_sockets) and "shell_channel_thread" in IPKernelApp.class_trait_names()
    ):
        return

    def init_sockets_without_shell_thread(self: Any, *args: Any, **kwargs: Any) -> None:
        init_sockets(self, *args, **kwargs)
        thread = self.shell_channel_thread
        if thread and not thread.is_alive():
            self.shell_channel_thread = _NoShellChannelThread()
            # its loop, never run: failing to close it is no reason to fail the kernel's start
            with contextlib.suppress(Exception):
                thread.io_loop.close()

    IPKernelApp.init_sockets = init_sockets_without_shell_thread  # type: ignore[method-assign]
    subshells = property(lambda kernel: bool(kernel.shell_channel_thread))
    Kernel._supports_kernel_subshells = subshells  # type: ignore[method-assign,assignment]


class _NoShellChannelThread:
    """Stands for the shell-channel thread a kernel does not have: false, and its
    ``parent_thread`` is the thread that reads the shell socket, the main thread."""

    def __init__(self) -> None:
        self.parent_thread = threading.main_thread()

    def __bool__(self) -> Any:
        return False


def lean_messaging() -> None:
    """Drop per-request work a stock kernel does for clients the pool's kernels never have.

    The pool is a kernel's only client, so: no ``execute_input`` rebroadcast of the code it
    just sent, and no ``busy`` status (the pool waits for ``idle`` only); ``log.debug``
    calls that no handler would print build no record; and a flush with nothing buffered
    skips its round trip to the IO thread. Every execution flushes stdout and stderr four
    times, each a thread hand-off of about 0.1 ms. Output still reaches IOPub before the idle
    status: a flush waits for a send under way (see :func:`_skip_idle_flushes`).
    """
    kernel = getattr(get_shell(), "kernel", None)
    if kernel is None or getattr(kernel, "_kernel_pool_lean", False):
        return
    vars(kernel)["_kernel_pool_lean"] = True
    kernel._publish_execute_input = _no_rebroadcast
    kernel._publish_status = _without_busy(kernel._publish_status)
    _reply_at_once(kernel)
    cap_streams(kernel)
    cap_messages(kernel)
    log: Any = getattr(kernel, "log", None)
    handlers = getattr(log, "handlers", None)
    if handlers and not getattr(log, "propagate", True):
        quietest = min(handler.level for handler in handlers)
        if quietest > log.level:
            log.setLevel(quietest)
    for stream in (sys.stdout, sys.stderr):
        _skip_idle_flushes(stream)
        _output_stays_with_the_cell(stream)
    _remember_signature_checks()
    _pack_lone_surrogates(getattr(kernel, "session", None))
    _hash_cells_in_c(getattr(get_shell(), "compile", None))


def _output_stays_with_the_cell(stream: Any) -> None:
    """What the cell's processes write to file descriptors 1 and 2 reaches the cell only.

    With ``capture_fd_output``, ipykernel's pipe reader also copies every byte it forwards
    to the kernel's original stdout or stderr, which is the pool owner's own output (a
    worker's log): a subprocess's output went there in full, uncapped, and raw lines broke
    a JSON log. And the stream's ``fileno()`` names that original, so
    ``subprocess.run(..., stdout=sys.stdout)`` or ``os.write(sys.stderr.fileno(), ...)``
    wrote into the owner's output instead of the cell's. The copy now leads nowhere, and
    ``fileno()`` names descriptor 1 or 2 itself: the pipe whose bytes reach the cell.
    """
    copy = getattr(stream, "_original_stdstream_copy", None)
    target = getattr(stream, "_original_stdstream_fd", None)
    if not isinstance(copy, int) or target not in (1, 2):
        return
    if getattr(stream, "watch_fd_thread", None) is None:
        return  # not capturing (ipykernel skips it under pytest): fd 1 and 2 are the originals
    devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.dup2(devnull, copy, inheritable=False)
    finally:
        os.close(devnull)
    stream.fileno = lambda: target


def _hash_cells_in_c(compiler: Any) -> None:
    """Name each cell's code from a hash computed in C.

    ipykernel names a cell's code after a murmur2 hash of its text written in Python: 1.4 ms
    per 10 KB of source, on every execution. The names keep their form (a file in the
    kernel's temporary folder, the same for the same text); only the debugger, which the
    pool's kernels never serve, computed them the other way too.
    """
    module = sys.modules.get("ipykernel.compiler")
    make_name = getattr(module, "get_tmp_directory", None)
    if make_name is None or type(compiler).__name__ != "XCachingCompiler":
        return
    import hashlib

    folder = make_name() + os.sep

    def get_code_name(raw_code: Any, code: Any, number: Any) -> Any:
        text = raw_code.encode("utf-8", "surrogatepass")
        return f"{folder}{hashlib.blake2b(text, digest_size=8).hexdigest()}.py"

    compiler.get_code_name = get_code_name


def _pack_lone_surrogates(session: Any) -> None:
    """Send text holding a lone surrogate (``'\\ud800'``) with U+FFFD in its place.

    ipykernel's packer cannot encode one (only those that stand for a byte, which the pool
    reads as U+FFFD), so the message was never sent: a cell's whole buffered output vanished.
    """
    pack = getattr(session, "pack", None)
    if pack is None or getattr(pack, "kernel_pool_lossless", False):
        return
    import json

    def pack_lossless(obj: Any) -> Any:
        try:
            return pack(obj)
        except ValueError:
            from jupyter_client.session import json_default  # type: ignore[attr-defined]

            text = json.dumps(obj, default=json_default, ensure_ascii=False, allow_nan=False)
            text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
            return text.encode("utf-8")

    vars(pack_lossless)["kernel_pool_lossless"] = True
    session.pack = pack_lossless


def _reply_at_once(kernel: Any) -> None:
    """Send an execution's reply as soon as its handler returns.

    ipykernel queues the reply and sends it after the output flushes and the idle status,
    and in between the reply waited its turn on the kernel's event loop: it reached the
    pool 0.5 to 1 ms after the idle status, and the pool answers on both. Where requests
    go through subshells, ipykernel does not flush the reply itself, and neither does this.
    """
    handlers: Any = getattr(kernel, "shell_handlers", None)
    handler = handlers.get("execute_request") if isinstance(handlers, dict) else None
    if handler is None or getattr(kernel, "_supports_kernel_subshells", True):
        return

    async def execute_request(stream: Any, ident: Any, parent: Any) -> None:
        result = handler(stream, ident, parent)
        if inspect.isawaitable(result):
            await result
        flush = getattr(stream, "flush", None)
        if flush is not None:
            flush(_POLLOUT)

    handlers["execute_request"] = execute_request


def _no_rebroadcast(*args: Any, **kwargs: Any) -> None:
    """``Kernel._publish_execute_input`` for a kernel whose only client sent the code."""


def _without_busy(publish_status: Any) -> Any:
    def publish_unless_busy(status: Any, *args: Any, **kwargs: Any) -> None:
        if status != "busy":
            publish_status(status, *args, **kwargs)
        if status == "idle" and _pending_reset:
            try:
                loop, reset = _pending_reset.pop()
            except IndexError:  # taken by a status another thread published
                return
            _start_after_send(loop, reset)

    vars(publish_unless_busy)["kernel_pool_starts_resets"] = True
    return publish_unless_busy


# the lease's last cell's reset, until its idle status is published
_pending_reset: list[tuple[Any, Callable[[], None]]] = []


def reset_after_idle(loop: Any, reset: Any) -> None:
    """Run ``reset()`` on ``loop`` once the idle status that ends this request is published
    and the IO thread has sent it. Without the hook that sees the status published, as soon
    as the handler yields."""
    kernel = getattr(get_shell(), "kernel", None)
    publish = getattr(kernel, "_publish_status", None)
    if getattr(publish, "kernel_pool_starts_resets", False):
        _pending_reset[:] = [(loop, reset)]
    else:
        loop.call_soon(reset)


def _start_after_send(loop: Any, reset: Any) -> None:
    start = functools.partial(loop.call_soon_threadsafe, reset)
    thread = getattr(getattr(get_shell(), "kernel", None), "iopub_thread", None)
    schedule = getattr(thread, "schedule", None)
    if schedule is None:
        start()
    else:
        schedule(start)  # queued behind the status: runs once the IO thread has sent it


def _remember_signature_checks() -> None:
    """ipykernel inspects ``shell.run_cell``'s signature on every execution (about 60 us);
    the answer only changes with the function, so it is kept per function."""
    try:
        from ipykernel import ipkernel
    except Exception:
        return
    check = getattr(ipkernel, "_accepts_parameters", None)
    if check is None or getattr(check, "remembers", False):
        return
    answers: dict[Any, Any] = {}

    def accepts_parameters(meth: Any, param_names: Any) -> Any:
        try:
            key = (getattr(meth, "__func__", meth), tuple(param_names))
            answer = answers.get(key)
        except TypeError:  # unhashable: ask every time
            return check(meth, param_names)
        if answer is None:
            if len(answers) >= 64:  # cells that keep replacing run_cell: stay small
                answers.clear()
            answer = answers[key] = check(meth, param_names)
        return dict(answer)

    vars(accepts_parameters)["remembers"] = True
    ipkernel._accepts_parameters = accepts_parameters  # type: ignore[attr-defined]


def _skip_idle_flushes(stream: Any) -> None:
    """Make ``stream.flush()`` return at once when nothing waits to be sent (an ipykernel
    ``OutStream`` only: its buffers, their lock and its pending flags are checked).

    Nothing waits only if no send is under way either: the IO thread's timed send takes the
    buffers (and clears the pending flag) before it encodes and queues them, which takes a
    millisecond or more for a large output. A flush that returned then let the kernel's
    idle status be queued ahead of that output, and the pool, which stops reading at idle,
    lost it. ipykernel's own flush queues behind the send under way, so it is used then.
    """
    names = ("_buffer_lock", "_buffers", "_flush_pending", "_subprocess_flush_pending", "_flush")
    if not all(hasattr(stream, name) for name in names) or getattr(stream, "echo", None):
        return
    flush = stream.flush
    send = stream._flush
    lock = stream._buffer_lock
    sending = [0]  # sends under way (the IO thread's; the caller's when that thread is gone)

    def counted_send() -> None:
        sending[0] += 1  # before the send clears the pending flag
        try:
            send()
        finally:
            sending[0] -= 1

    def flush_if_pending() -> None:
        if not (stream._flush_pending or stream._subprocess_flush_pending or sending[0]):
            with lock:
                if not any(buffer.tell() for buffer in list(stream._buffers.values())):
                    return
        flush()

    stream._flush = counted_send
    stream.flush = flush_if_pending
