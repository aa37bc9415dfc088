"""How much of a cell's stdout and stderr a kernel publishes: at most a cap per stream.

Set up by ``messaging``: :func:`cap_streams` is run once, with the baseline.

An ``execute_request`` whose metadata carries ``{"kernel_pool": {"stream_cap": N}}``
publishes at most N characters of stdout and N of stderr. Past the cap a stream publishes
nothing more and counts the characters it drops; when the request's handler returns (before
the kernel's idle status), the counts go out as one ``kernel_pool_stream_dropped`` IOPub
message, ``{"stdout": n, "stderr": m}`` (only when something was dropped). A request
without a cap publishes everything, as a stock kernel does.

Everything that becomes stdout or stderr passes through ``OutStream.write``, which is
capped for every instance (one a cell made itself too): ``print``, ``sys.stdout.write``,
and what the cell's processes write to file descriptors 1 and 2 (``os.system``, a
subprocess, a C library's ``printf``), which ipykernel's pipe readers pass to the same
streams. Those readers keep reading past the cap, so a subprocess never blocks on a full
pipe; what they read is counted and dropped.

The IOPub socket queues whatever the pool has not read yet, without ZMQ's limit of 1,000
messages (see :func:`_publish_everything`).

Before, a cell printing 1 GB made the kernel buffer it between flushes (0.2 s) and send it
as a few messages of hundreds of MB each, and the pool's process decoded all of it before
keeping 16 MB. Kept text now also goes out in pieces of at most :data:`_PIECE` characters:
a write that fills a piece waits until the IO thread has sent it, so no message (in the
kernel or in its reader) holds more than two pieces: under 1 MiB of JSON even when every
character is escaped (6 bytes), which is what the pool's ``max_iopub_message`` may ask.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import threading
from typing import Any

from .sizes import start_message_cap

STREAM_DROPPED_MSG_TYPE = "kernel_pool_stream_dropped"
_STREAM_DROPPED_TOPIC = b"kernel_pool.stream_dropped"
_PIECE = 1 << 15  # characters of kept text per message, about


class _Budget:
    """One stream's allowance in the request being handled (None: no cap)."""

    __slots__ = ("cap", "dropped", "lock", "unsent", "used")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cap = None
        self.used = self.dropped = self.unsent = 0

    def start(self, cap: Any) -> None:
        with self.lock:
            self.cap = cap
            self.used = self.dropped = self.unsent = 0

    def take(self, size: int) -> Any:
        """How many of ``size`` characters may be published (the rest are counted)."""
        with self.lock:
            if self.cap is None:
                return size
            kept = min(size, max(self.cap - self.used, 0))
            self.used += kept
            self.dropped += size - kept
            return kept

    def fills_piece(self, size: int) -> Any:
        """Count ``size`` characters handed to the stream; whether a piece is now due."""
        with self.lock:
            if self.cap is None:
                return False
            self.unsent += size
            if self.unsent < _PIECE:
                return False
            self.unsent = 0
            return True


_budgets = {"stdout": _Budget(), "stderr": _Budget()}


def cap_streams(kernel: Any) -> None:
    """Cap every ``OutStream``'s writes, and start each request's allowance from its cap."""
    _publish_everything(kernel)
    _no_pipe_port(kernel)
    _no_output_history(getattr(kernel, "shell", None))
    try:
        from ipykernel.iostream import OutStream
    except ImportError:
        return
    if not getattr(OutStream.write, "kernel_pool_capped", False):
        OutStream.write = _capped(OutStream.write)  # type: ignore[method-assign]
    if not getattr(OutStream.flush, "kernel_pool_capped", False):
        OutStream.flush = _flushing_child_lines(OutStream.flush)  # type: ignore[method-assign]
    handlers: Any = getattr(kernel, "shell_handlers", None)
    handler = handlers.get("execute_request") if isinstance(handlers, dict) else None
    if handler is None or getattr(handler, "kernel_pool_capped", False):
        return

    async def execute_request(stream: Any, ident: Any, parent: Any) -> None:
        with contextlib.suppress(Exception):  # whatever it finds, the request is handled
            cap = _asked_cap(parent)
            start_message_cap(parent)
            for budget in _budgets.values():
                budget.start(cap)
            _class_write_applies(sys.stdout)
            _class_write_applies(sys.stderr)
        try:
            result = handler(stream, ident, parent)
            if inspect.isawaitable(result):
                await result
        finally:
            _report_dropped(kernel, parent)

    vars(execute_request)["kernel_pool_capped"] = True
    handlers["execute_request"] = execute_request


def _class_write_applies(stream: Any) -> None:
    """Remove the uncapped ``write`` that IPython left on the instance itself.

    IPython's ``run_cell`` wraps each stream's ``write`` while a cell runs (see
    :func:`_no_output_history`) and then sets back what it found, as an attribute of the
    instance: after the cell that capped the class (the one capturing the baseline), that
    was the bound, uncapped ``write``, which hid the class's from then on.
    """
    attributes = getattr(stream, "__dict__", {})
    own = attributes.get("write")
    original = getattr(getattr(type(stream), "write", None), "kernel_pool_original", None)
    if original is None or own is None:
        return
    if getattr(own, "__func__", None) is original and getattr(own, "__self__", None) is stream:
        attributes.pop("write", None)


def _no_output_history(shell: Any) -> None:
    """Keep IPython from keeping a copy of everything a cell prints.

    IPython 9 wraps the streams' ``write`` while a cell runs and appends every piece
    written to its output history, which the pool's kernels never save (their history is
    off) and never show. The copy outlived the cell (a request runs without its own
    execution count, so every request's output went under the same one): a cell that
    printed 1 GB left 1 GB in the kernel, cap or not.
    """
    manager = getattr(shell, "history_manager", None)
    if getattr(manager, "enabled", True) or not callable(getattr(shell, "_tee", None)):
        return
    shell._tee = _not_kept


def _not_kept(channel: Any) -> Any:
    return contextlib.nullcontext()


def _publish_everything(kernel: Any) -> None:
    """Lift the IOPub socket's limit on messages queued for a subscriber (ZMQ's default is
    1,000; a publisher drops what does not fit, an idle status too).

    The pool reads ahead only a few messages (it bounds its memory, whatever a kernel
    sends); past them, what the kernel publishes waits here, in the kernel's own memory.
    Set on the IO thread, which owns the socket; ZMQ applies it to the pool's connection.
    """
    thread = getattr(kernel, "iopub_thread", None)
    sock = getattr(thread, "socket", None)
    schedule = getattr(thread, "schedule", None)
    if sock is None or schedule is None:
        return
    try:
        import zmq
    except ImportError:
        return

    def unlimited() -> None:
        with contextlib.suppress(Exception):
            sock.setsockopt(zmq.SNDHWM, 0)

    schedule(unlimited)


def _no_pipe_port(kernel: Any) -> None:
    """Close ipykernel's port for forked children's output.

    A stock kernel listens on a loopback TCP port for what its forked children (a
    ``multiprocessing`` fork, ``os.fork``) print, and any local user can connect to it: with
    a uid per kernel, a sibling could write into the stderr of the request this kernel runs.
    A forked child's writes go to the file descriptor it inherited instead (see
    :func:`_capped`), which the kernel captures as it captures any subprocess's output.
    """
    thread = getattr(kernel, "iopub_thread", None)
    stream = getattr(thread, "_pipe_in", None)
    schedule = getattr(thread, "schedule", None)
    if stream is None or schedule is None:
        return

    def close() -> None:
        with contextlib.suppress(Exception):
            stream.close()

    schedule(close)  # on the IO thread, which owns the socket


_STD_FDS = {"stdout": 1, "stderr": 2}
_child_lines: dict[Any, Any] = {}  # fd -> a forked child's text after its last newline


def _write_fd(fd: int, text: str) -> None:
    with contextlib.suppress(OSError):
        if text:
            os.write(fd, text.encode("utf-8", "replace"))


def _flushing_child_lines(flush: Any) -> Any:
    def flush_lines(self: Any) -> Any:
        fd = _STD_FDS.get(getattr(self, "name", ""))
        master = getattr(self, "_master_pid", None)
        if fd is not None and master is not None and master != os.getpid():
            _write_fd(fd, _child_lines.pop(fd, ""))
            return None
        return flush(self)

    vars(flush_lines)["kernel_pool_capped"] = True
    flush_lines.__doc__ = flush.__doc__
    return flush_lines


def _asked_cap(parent: Any) -> Any:
    metadata = parent.get("metadata") if isinstance(parent, dict) else None
    asked = metadata.get("kernel_pool") if isinstance(metadata, dict) else None
    cap = asked.get("stream_cap") if isinstance(asked, dict) else None
    return cap if type(cap) is int and cap >= 0 else None


def _capped(write: Any) -> Any:
    def capped_write(self: Any, string: Any) -> Any:
        master = getattr(self, "_master_pid", None)
        fd = _STD_FDS.get(getattr(self, "name", ""))
        child = master is not None and master != os.getpid()
        if child and fd is not None and isinstance(string, str):
            # a forked child: whole lines go to the kernel's captured descriptor
            pending = _child_lines.get(fd, "") + string
            end = pending.rfind("\n") + 1
            _child_lines[fd] = pending[end:]
            _write_fd(fd, pending[:end])
            return len(string)
        budget = _budgets.get(getattr(self, "name", ""))
        if budget is None or not isinstance(string, str):
            return write(self, string)  # (a non-str raises as it did)
        size = len(string)
        kept = budget.take(size)
        if kept < size:
            string = string[:kept]
        for start in range(0, kept, _PIECE):
            piece = string[start : start + _PIECE] if kept > _PIECE else string
            write(self, piece)
            if budget.fills_piece(len(piece)):
                self.flush()  # waits until the IO thread has sent it
        return size

    vars(capped_write)["kernel_pool_capped"] = True
    vars(capped_write)["kernel_pool_original"] = write
    capped_write.__doc__ = write.__doc__
    return capped_write


def _report_dropped(kernel: Any, parent: Any) -> None:
    dropped = {name: budget.dropped for name, budget in _budgets.items() if budget.dropped}
    if not dropped:
        return
    # the kept text is out: the counts are all that a failure here would lose
    with contextlib.suppress(Exception):
        kernel.session.send(
            kernel.iopub_socket,
            STREAM_DROPPED_MSG_TYPE,
            dropped,
            parent=parent,
            ident=_STREAM_DROPPED_TOPIC,
        )
