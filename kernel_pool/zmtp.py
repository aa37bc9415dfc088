"""ZMTP 3.0, the wire protocol ZMQ speaks, spoken by the pool itself to a kernel's sockets.

libzmq hands a message to its reader only once every frame of it has arrived, and its
limits are per frame (``ZMQ_MAXMSGSIZE``) and per message (the high-water mark counts
messages, not bytes): a kernel that sent one ``display_data`` of 1,600 buffers of 500 KiB
each had 800 MB held in the worker before its size could be looked at. Here a
connection's bytes are read from the socket a bounded amount at a time and each frame is
counted as its header arrives: once a message's frames add up to more than
``max_message`` bytes, the rest of it is skipped as it arrives, never held, and the
message is reported as ``None``.

Only what the pool needs of ZMTP (RFC 23): the NULL mechanism (a kernel's sockets are
Unix sockets in its private folder, or TCP on loopback), a DEALER (shell) or a SUB
(IOPub, everything subscribed) that connects, retrying while the kernel has not bound
yet and after the kernel closed the connection (as ZMQ does). Commands the peer sends
after the handshake (``PING``, ``SUBSCRIBE``) are read and ignored; an ``ERROR`` ends the
connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import deque
from collections.abc import Callable, Sequence
from typing import Literal

log = logging.getLogger(__name__)

Received = Callable[[list[bytes] | None], None]
"""Receives each whole message read, or None for one over ``max_message`` (skipped)."""
SocketType = Literal["DEALER", "SUB"]

_GREETING = (
    b"\xff" + bytes(8) + b"\x7f"  # signature
    + b"\x03\x00"  # version 3.0
    + b"NULL".ljust(20, b"\x00")  # mechanism
    + b"\x00"  # as-server: no
    + bytes(31)  # filler
)  # fmt: skip
_MORE, _LONG, _COMMAND = 1, 2, 4
_MAX_COMMAND = 1 << 16  # a command's body (READY, PING) is small: a larger one is skipped
_READ = 1 << 18  # bytes asked of the socket at once
_WAKE_BYTES = 1 << 20  # bytes read per wake-up before yielding to the rest of the loop
_WAKE_MESSAGES = 64  # ...or messages delivered
_RETRY_SECONDS = (0.01, 0.2)  # first and largest wait before connecting again


class _ProtocolError(Exception):
    """The peer does not speak ZMTP 3 with the NULL mechanism."""


class Connection:
    """One ZMTP connection to ``address`` (``ipc://PATH`` or ``tcp://HOST:PORT``), read on
    the event loop whenever its socket is readable."""

    def __init__(
        self,
        address: str,
        socket_type: SocketType,
        received: Received,
        *,
        identity: bytes = b"",
        max_message: int | None = None,
    ) -> None:
        self._address = address
        self._type = socket_type
        self._received = received
        self._identity = identity
        self._max_message = max_message
        self._loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = None
        self._writing = False
        self._out: deque[memoryview] = deque()  # bytes the socket has not taken yet
        self._pending: list[list[bytes]] = []  # messages sent before the handshake ended
        self._retry = _RETRY_SECONDS[0]
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._parse_soon = False
        self._reset_stream()
        self._connect()

    # -- the connection ----------------------------------------------------------------------

    def _reset_stream(self) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._greeted = False
        self._ready = False
        self._frames: list[bytes] = []
        self._size = 0  # bytes of the message being read
        self._skip = 0  # bytes of a frame still to be skipped
        self._skip_more = False  # whether the frame being skipped has more after it
        self._dropping = False  # the message being read is over the limit

    def _connect(self) -> None:
        self._timer = None
        if self._closed:
            return
        scheme, _, rest = self._address.partition("://")
        if scheme == "ipc":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: str | tuple[str, int] = rest
        else:
            host, _, port = rest.rpartition(":")
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            target = (host.strip("[]"), int(port))
        sock.setblocking(False)
        try:
            sock.connect(target)
        except (BlockingIOError, InterruptedError):  # a TCP connect under way
            self._sock = sock
            self._loop.add_writer(sock.fileno(), self._connect_done)
            return
        except OSError:  # not bound yet (or gone): again in a moment
            sock.close()
            self._again()
            return
        self._sock = sock
        self._opened()

    def _connect_done(self) -> None:
        sock = self._sock
        assert sock is not None
        self._loop.remove_writer(sock.fileno())
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self._drop()
            return
        self._opened()

    def _opened(self) -> None:
        assert self._sock is not None
        self._retry = _RETRY_SECONDS[0]
        self._out.append(memoryview(_GREETING))
        self._loop.add_reader(self._sock.fileno(), self._readable)
        self._flush()

    def _again(self) -> None:
        if not self._closed and self._timer is None:
            self._timer = self._loop.call_later(self._retry, self._connect)
            self._retry = min(self._retry * 2, _RETRY_SECONDS[1])

    def _drop(self) -> None:
        """The connection ended (the kernel closed it, died, or spoke nonsense): what it
        had not sent is lost; connect again, as ZMQ does."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(sock.fileno())
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_writer(sock.fileno())
            sock.close()
        self._writing = False
        self._out.clear()
        self._reset_stream()
        self._again()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(sock.fileno())
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_writer(sock.fileno())
            sock.close()
        self._out.clear()
        self._pending.clear()
        self._buf = bytearray()
        self._frames = []

    # -- sending -------------------------------------------------------------------------------

    def send(self, frames: Sequence[bytes | memoryview]) -> None:
        """Send one message (queued until the handshake ended; dropped if the connection
        ends first, as a DEALER's would be)."""
        if self._closed:
            return
        if not self._ready:
            self._pending.append([bytes(frame) for frame in frames])
            return
        self._queue(frames)
        self._flush()

    def _queue(self, frames: Sequence[bytes | memoryview]) -> None:
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            body = memoryview(frame).cast("B")
            flags = _MORE if i < last else 0
            if len(body) > 255:
                header = bytes((flags | _LONG,)) + len(body).to_bytes(8, "big")
            else:
                header = bytes((flags, len(body)))
            self._out.append(memoryview(header))
            if len(body):
                self._out.append(body)

    def _flush(self) -> None:
        sock = self._sock
        if sock is None or self._closed:
            return
        while self._out:
            try:
                sent = sock.sendmsg(list(_first(self._out, 64)))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop()
                return
            while sent:
                head = self._out[0]
                if len(head) <= sent:
                    sent -= len(head)
                    self._out.popleft()
                else:
                    self._out[0] = head[sent:]
                    sent = 0
        if self._out and not self._writing:
            self._writing = True
            self._loop.add_writer(sock.fileno(), self._flush)
        elif not self._out and self._writing:
            self._writing = False
            self._loop.remove_writer(sock.fileno())

    # -- reading -------------------------------------------------------------------------------

    def _readable(self) -> None:
        """Read what is waiting, a bounded amount per wake-up: the socket's readiness brings
        the next, or, when the wake-up's messages were used up, the next turn of the loop."""
        self._parse_soon = False
        try:
            delivered = self._parse(_WAKE_MESSAGES)
            read = 0
            while delivered < _WAKE_MESSAGES and read < _WAKE_BYTES:
                sock = self._sock
                if sock is None or self._closed:
                    return
                try:
                    data = sock.recv(_READ)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError as exc:
                    log.debug("a kernel's %s connection failed: %s", self._type, exc)
                    self._drop()
                    return
                if not data:
                    self._drop()
                    return
                read += len(data)
                self._buf += data
                delivered += self._parse(_WAKE_MESSAGES - delivered)
        except _ProtocolError as exc:
            log.warning("a kernel's %s connection spoke no ZMTP 3: %s", self._type, exc)
            self._drop()
            return
        if delivered >= _WAKE_MESSAGES and not self._parse_soon and self._sock is not None:
            self._parse_soon = True  # whole messages may be left in the buffer
            self._loop.call_soon(self._readable)

    def _parse(self, budget: int) -> int:
        """Deliver up to ``budget`` whole messages from the buffer; how many were."""
        delivered = 0
        buf = self._buf
        while delivered < budget and not self._closed and self._buf is buf:
            available = len(buf) - self._pos
            if self._skip:
                step = min(self._skip, available)
                self._pos += step
                self._skip -= step
                if self._skip:
                    break
                if not self._skip_more:
                    self._dropping = False
                continue
            if not self._greeted:
                if available < len(_GREETING):
                    break
                self._greet(bytes(buf[self._pos : self._pos + len(_GREETING)]))
                self._pos += len(_GREETING)
                continue
            header = self._frame_header(buf, available)
            if header is None:
                break
            flags, size, header_bytes = header
            if flags & _COMMAND:
                if size > _MAX_COMMAND:
                    self._pos += header_bytes
                    self._skip, self._skip_more = size, bool(self._dropping)
                    continue
                if available < header_bytes + size:
                    break
                start = self._pos + header_bytes
                self._pos = start + size
                self._command(bytes(buf[start : start + size]))
                continue
            more = bool(flags & _MORE)
            limit = self._max_message
            if self._dropping or (limit is not None and self._size + size > limit):
                if not self._dropping:  # the first frame past the limit: say it once
                    self._dropping = True
                    self._frames, self._size = [], 0
                    delivered += 1
                    self._received(None)
                self._pos += header_bytes
                self._skip, self._skip_more = size, more
                if not size and not more:
                    self._dropping = False
                continue
            if available < header_bytes + size:
                break
            start = self._pos + header_bytes
            self._frames.append(bytes(buf[start : start + size]))
            self._pos = start + size
            self._size += size
            if not more:
                frames, self._frames, self._size = self._frames, [], 0
                delivered += 1
                if self._ready:
                    self._received(frames)
        if self._buf is buf:
            self._compact()
        return delivered

    def _compact(self) -> None:
        if self._pos and (self._pos >= len(self._buf) or self._pos > (1 << 20)):
            del self._buf[: self._pos]
            self._pos = 0

    def _frame_header(self, buf: bytearray, available: int) -> tuple[int, int, int] | None:
        if available < 2:
            return None
        flags = buf[self._pos]
        if flags & _LONG:
            if available < 9:
                return None
            return flags, int.from_bytes(buf[self._pos + 1 : self._pos + 9], "big"), 9
        return flags, buf[self._pos + 1], 2

    def _greet(self, greeting: bytes) -> None:
        if greeting[0] != 0xFF or not greeting[9] & 1 or greeting[10] < 3:
            raise _ProtocolError("not a ZMTP 3 greeting")
        if greeting[12:32].rstrip(b"\x00") != b"NULL":
            raise _ProtocolError("a security mechanism other than NULL")
        self._greeted = True
        # the handshake goes on once both greetings are through, as libzmq's own does (a
        # READY that came with the greeting was not read by it)
        properties = _property(b"Socket-Type", self._type.encode())
        if self._identity:
            properties += _property(b"Identity", self._identity)
        self._out.append(memoryview(_command(b"READY", properties)))
        if self._type == "SUB":  # subscribe to everything (ZMTP 3.0's form), on each connection
            self._queue([b"\x01"])
        self._flush()

    def _command(self, body: bytes) -> None:
        name = body[1 : 1 + body[0]] if body else b""
        if name == b"READY" and not self._ready:
            self._ready = True
            pending, self._pending = self._pending, []
            for frames in pending:
                self._queue(frames)
            self._flush()
        elif name == b"ERROR":
            raise _ProtocolError("the peer sent ERROR")
        elif not self._ready:
            raise _ProtocolError(f"{name!r} before READY")


def _first(items: deque[memoryview], count: int) -> list[memoryview]:
    return [items[i] for i in range(min(count, len(items)))]


def _property(name: bytes, value: bytes) -> bytes:
    return bytes((len(name),)) + name + len(value).to_bytes(4, "big") + value


def _command(name: bytes, data: bytes) -> bytes:
    body = bytes((len(name),)) + name + data
    if len(body) > 255:
        return bytes((_COMMAND | _LONG,)) + len(body).to_bytes(8, "big") + body
    return bytes((_COMMAND, len(body))) + body
