"""The pool's two sockets to a kernel (shell and IOPub), read by the event loop directly.

jupyter_client's asyncio channels create a future, a poller registration and several enum
operations for every message; a warm kernel's cell is only a handful of small messages, so
that machinery was a measurable share of a cell's cost. Here each socket's file descriptor
is watched with ``loop.add_reader`` and drained without blocking: messages are decoded
(:func:`decode`, HMAC checked) and handed to ``deliver`` in arrival order per socket.

What a kernel sends is read a bounded amount at a time, whatever it sends. Each wake-up
reads at most :data:`_BATCH` messages or, once they add up to it, :data:`_BATCH_BYTES`
(one read 64 messages of 8 MB each from a cell that printed 1 GB, and decoded them all
while ``/health`` waited seconds). And ZMQ holds at most :data:`_IOPUB_QUEUE` IOPub
messages the pool has not read yet: past that it stops reading the kernel's socket, and
the kernel holds what it publishes (its helper lifts the kernel's own limit, past which a
publisher drops messages, so nothing is lost, an idle status included; see
``inkernel/streams.py``). ZMQ's default let the pool's process queue a thousand messages
of any size from a kernel that published faster than it read.

With ``max_message`` (the worker sets it), no IOPub frame larger than that is taken in at
all: ZMQ drops the connection on one (``ZMQ_MAXMSGSIZE``, checked as the frame's size
arrives, before its bytes are held) and reconnects, and a message whose frames add up to
more is dropped before it is decoded. Either way the kernel is told of as
``(UNREADABLE, {"channel": "iopub", "oversized": max_message})``: what it published was
lost (on a dropped connection, also what was queued behind that frame), and its reader
decides. So what the pool holds of a kernel's IOPub is bounded by bytes, not only by a
count of messages: about ``_IOPUB_QUEUE + 2`` messages of at most ``max_message`` each.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import zmq
from jupyter_client.session import Session

from .messages import decode

log = logging.getLogger(__name__)

Deliver = Callable[[str, dict[str, Any]], None]
"""Receives ``(channel name, message)`` for every message read; for one that could not be
read, ``(UNREADABLE, {"channel": name})``."""
UNREADABLE = "unreadable"

_RECONNECT_MS = 10
_BATCH = 64  # messages read per wake-up before yielding to the rest of the loop
_BATCH_BYTES = 1 << 20  # ...or, once a message took the total past this, bytes
_IOPUB_QUEUE = 2  # IOPub messages read ahead by ZMQ (the kernel holds the rest)
_context: zmq.Context[zmq.Socket[bytes]] | None = None
_monitor_ids = itertools.count(1)


def _shared_context() -> zmq.Context[zmq.Socket[bytes]]:
    global _context
    if _context is None:
        _context = zmq.Context()
    return _context


def endpoint(info: Mapping[str, Any], channel: str) -> str:
    """The ZMQ address of ``channel`` ("shell", "iopub") in a kernel's connection info."""
    transport, ip, port = info["transport"], info["ip"], info[f"{channel}_port"]
    return f"ipc://{ip}-{port}" if transport == "ipc" else f"{transport}://{ip}:{port}"


class _Reader:
    """One socket, drained on the event loop whenever its descriptor signals."""

    def __init__(
        self,
        sock: zmq.Socket[bytes],
        name: str,
        auth: Any,
        deliver: Deliver,
        *,
        max_message: int | None = None,
        before: Callable[[], None] | None = None,
    ) -> None:
        self.sock = sock
        self.name = name
        self._auth = auth
        self._deliver = deliver
        self._max_message = max_message
        self._before = before
        self._loop = asyncio.get_running_loop()
        self._fd = int(sock.getsockopt(zmq.FD))
        self._closed = False
        self._loop.add_reader(self._fd, self.drain)
        self._loop.call_soon(self.drain)  # the descriptor is edge-triggered

    def drain(self) -> None:
        """Read what is waiting (at most a batch, then continue on the next loop turn)."""
        if self._before is not None:  # what happened to the connection, before what it sent
            self._before()
        read = 0
        for _ in range(_BATCH):
            if self._closed:
                return
            if read >= _BATCH_BYTES:
                break
            try:
                if not int(self.sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                    return
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:  # torn down; the kernel's death is reported apart
                log.debug("%s socket closed", self.name, exc_info=True)
                self.close()
                return
            size = sum(map(len, frames))
            read += size
            if self._max_message is not None and size > self._max_message:
                log.warning("a kernel sent a %s message of %d bytes: dropped", self.name, size)
                del frames
                self._deliver(UNREADABLE, {"channel": self.name, "oversized": self._max_message})
                continue
            try:
                msg = decode(frames, self._auth)
            except (ValueError, TypeError, UnicodeDecodeError):
                log.warning("a kernel sent an unreadable %s message", self.name)
                # what it said is lost (a reply, a status, an output): its reader decides
                self._deliver(UNREADABLE, {"channel": self.name})
                continue
            self._deliver(self.name, msg)
        self._loop.call_soon(self.drain)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._fd)
        self.sock.close(linger=0)


class _Disconnects:
    """The IOPub socket's dropped connections (ZMQ's monitor), told as oversized messages:
    with ``ZMQ_MAXMSGSIZE`` set, a live kernel's connection is dropped only for one."""

    def __init__(self, iopub: zmq.Socket[bytes], max_message: int, deliver: Deliver) -> None:
        # an address of its own: pyzmq's default names it by the socket's descriptor, which a
        # later kernel's socket reuses while this monitor may still be bound
        address = f"inproc://kernel-pool-monitor-{next(_monitor_ids)}"
        iopub.monitor(address, zmq.EVENT_DISCONNECTED)
        self._iopub = iopub
        self._sock = _shared_context().socket(zmq.PAIR)
        self._sock.connect(address)
        self._max_message = max_message
        self._deliver = deliver
        self._loop = asyncio.get_running_loop()
        self._fd = int(self._sock.getsockopt(zmq.FD))
        self._closed = False
        self._loop.add_reader(self._fd, self.drain)

    def drain(self) -> None:
        while not self._closed:
            try:
                if not int(self._sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                    return
                event = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:  # zmq.Again included
                return
            # a 16-bit event id and a 32-bit value, then the endpoint
            if len(event) != 2 or len(event[0]) != 6:
                continue
            if int.from_bytes(event[0][:2], sys.byteorder) == zmq.EVENT_DISCONNECTED:
                # also when a kernel ends (every retirement): not worth a warning
                log.info("a kernel's IOPub connection was dropped (an oversized message?)")
                self._deliver(UNREADABLE, {"channel": "iopub", "oversized": self._max_message})

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._fd)
        with contextlib.suppress(zmq.ZMQError):
            self._iopub.disable_monitor()
        self._sock.close(linger=0)


class KernelChannels:
    """Shell (requests and replies) and IOPub (outputs) of one kernel."""

    def __init__(
        self,
        info: Mapping[str, Any],
        session: Session,
        deliver: Deliver,
        *,
        max_message: int | None = None,
    ) -> None:
        """``max_message``: the most bytes an IOPub message may take (None: any)."""
        self.session = session
        context = _shared_context()
        shell = context.socket(zmq.DEALER)
        shell.setsockopt(zmq.IDENTITY, session.bsession)
        shell.setsockopt(zmq.LINGER, 0)
        iopub = context.socket(zmq.SUB)
        iopub.setsockopt(zmq.SUBSCRIBE, b"")
        iopub.setsockopt(zmq.LINGER, 0)
        iopub.setsockopt(zmq.RCVHWM, _IOPUB_QUEUE)
        if max_message is not None:
            iopub.setsockopt(zmq.MAXMSGSIZE, max_message)
        for sock in (shell, iopub):  # a starting kernel binds late: retry every 10 ms
            sock.setsockopt(zmq.RECONNECT_IVL, _RECONNECT_MS)
        try:
            shell.connect(endpoint(info, "shell"))
            iopub.connect(endpoint(info, "iopub"))
        except zmq.ZMQError:
            shell.close(linger=0)
            iopub.close(linger=0)
            raise
        self._disconnects = (
            _Disconnects(iopub, max_message, deliver) if max_message is not None else None
        )
        self._shell = _Reader(shell, "shell", session.auth, deliver)
        self._iopub = _Reader(
            iopub, "iopub", session.auth, deliver,
            max_message=max_message,
            before=self._disconnects.drain if self._disconnects is not None else None,
        )  # fmt: skip

    def send(
        self,
        msg_type: str,
        content: Mapping[str, Any],
        *,
        metadata: Mapping[str, Any] | None = None,
        buffers: Sequence[bytes | memoryview] = (),
    ) -> str:
        """Send a shell request; returns its ``msg_id`` (replies come through ``deliver``)."""
        msg = self.session.msg(msg_type, dict(content))
        if metadata:
            msg["metadata"] = dict(metadata)
        self.session.send(self._shell.sock, msg, buffers=list(buffers))  # type: ignore[arg-type]
        # sending can consume the descriptor's edge: look for a reply that raced it
        asyncio.get_running_loop().call_soon(self._shell.drain)
        return str(msg["header"]["msg_id"])

    def close(self) -> None:
        if self._disconnects is not None:
            self._disconnects.close()
        self._shell.close()
        self._iopub.close()
