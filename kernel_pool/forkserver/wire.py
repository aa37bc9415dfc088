"""The framing of what the pool and its fork server say to each other (the pool's half).

One request per datagram on a ``SOCK_SEQPACKET`` socket: a JSON object compressed with
zlib, a file descriptor attached where the request passes one (``SCM_RIGHTS``). One reply
per datagram: a JSON object, whole, under :data:`REPLY_BYTES`, carrying its request's
``id``. What cannot be read as such a reply leaves the fork server's state unknown
(:class:`ForkServerLost`). ``_zygote.py`` is the other half.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import zlib
from typing import Any

from ..errors import KernelStartError

REPLY_BYTES = 64 << 10  # the most a reply may take (the fork server keeps them under 48 KiB)


class ForkServerLost(KernelStartError):
    """The fork server exited, did not answer in time, or answered what cannot be read."""

    def __init__(self, message: str, *, timed_out: bool = False, unreadable: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.unreadable = unreadable


def encode_request(request: dict[str, Any]) -> bytes:
    """One datagram, compressed: the environment and the sources it may carry outgrew what
    a socket buffer takes at its default size (212992 bytes)."""
    return zlib.compress(json.dumps(request).encode(), 1)


async def send_with_fd(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, data: bytes, fd: int
) -> None:
    """Send one datagram with ``fd`` attached (``SCM_RIGHTS``), waiting while it is full."""
    while True:
        try:
            socket.send_fds(sock, [data], [fd] if fd >= 0 else [])
            return
        except BlockingIOError:
            ready = loop.create_future()
            loop.add_writer(sock, ready.set_result, None)
            try:
                await ready
            finally:
                loop.remove_writer(sock)


async def receive(loop: asyncio.AbstractEventLoop, sock: socket.socket, deadline: float) -> bytes:
    """The next datagram by ``deadline`` (:class:`TimeoutError` then); empty once the fork
    server has closed its end."""
    remaining = max(0.0, deadline - time.monotonic())
    # one datagram per reply: a larger one than asked for would come cut
    return await asyncio.wait_for(loop.sock_recv(sock, REPLY_BYTES + 1), remaining)


def readable_reply(data: bytes) -> dict[str, Any] | None:
    """A reply as the fork server sends it (a JSON object, whole), or None."""
    if len(data) > REPLY_BYTES:
        return None
    try:
        reply = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return reply if isinstance(reply, dict) else None
