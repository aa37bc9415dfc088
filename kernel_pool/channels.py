"""The pool's two connections to a kernel (shell and IOPub), read by the event loop directly.

Each is a :class:`~kernel_pool.zmtp.Connection`: the pool speaks ZMTP to the kernel's
sockets itself, reading each connection's bytes a bounded amount per wake-up (at most 64
messages or 1 MiB, then the rest of the loop runs: one read of a cell that printed 1 GB
once decoded 64 messages of 8 MB each while ``/health`` waited seconds). Messages are
decoded (:func:`decode`, HMAC checked) and handed to ``deliver`` in arrival order per
connection. What is not read yet stays in the kernel: its socket buffer fills and the
kernel holds what it publishes (its helper lifts the kernel's own limit, past which a
publisher drops messages, so nothing is lost, an idle status included; see
``inkernel/streams.py``).

With ``max_message`` (the worker sets it), no message on either connection is held past
that many bytes: frames are counted as their headers arrive, and a message whose frames
add up to more is skipped as the rest of it arrives, whatever its number of frames (ZMQ's
own limit bounded a frame, and held a message of 1,600 frames of 500 KiB whole). The kernel
is told of it as ``(UNREADABLE, {"channel": name, "oversized": max_message})``: that
message was lost, and its reader decides. So what the pool holds of a kernel's messages is
bounded by bytes: a message of at most ``max_message`` being read, plus one read, per
connection. The pool connects no other socket of a kernel (control, stdin, heartbeat):
nothing a kernel sends there reaches the pool's memory.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jupyter_client.session import Session

from .messages import decode
from .zmtp import Connection

log = logging.getLogger(__name__)

Deliver = Callable[[str, dict[str, Any]], None]
"""Receives ``(channel name, message)`` for every message read; for one that could not be
read, ``(UNREADABLE, {"channel": name})``, with ``"oversized": max_message`` when it was
over the limit."""
UNREADABLE = "unreadable"


def endpoint(info: Mapping[str, Any], channel: str) -> str:
    """The ZMQ address of ``channel`` ("shell", "iopub") in a kernel's connection info."""
    transport, ip, port = info["transport"], info["ip"], info[f"{channel}_port"]
    return f"ipc://{ip}-{port}" if transport == "ipc" else f"{transport}://{ip}:{port}"


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
        """``max_message``: the most bytes a message may take, on either channel (None: any)."""
        self.session = session
        self._deliver = deliver
        self._max_message = max_message
        self._shell = Connection(
            endpoint(info, "shell"), "DEALER", functools.partial(self._received, "shell"),
            identity=session.bsession, max_message=max_message,
        )  # fmt: skip
        self._iopub = Connection(
            endpoint(info, "iopub"), "SUB", functools.partial(self._received, "iopub"),
            max_message=max_message,
        )  # fmt: skip

    def _received(self, name: str, frames: list[bytes] | None) -> None:
        if frames is None:
            log.warning("a kernel sent a %s message over %s bytes", name, self._max_message)
            self._deliver(UNREADABLE, {"channel": name, "oversized": self._max_message})
            return
        try:
            msg = decode(frames, self.session.auth)
        except (ValueError, TypeError, UnicodeDecodeError):
            log.warning("a kernel sent an unreadable %s message", name)
            # what it said is lost (a reply, a status, an output): its reader decides
            self._deliver(UNREADABLE, {"channel": name})
            return
        self._deliver(name, msg)

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
        self._shell.send([*self.session.serialize(msg), *buffers])
        return str(msg["header"]["msg_id"])

    def close(self) -> None:
        self._shell.close()
        self._iopub.close()
