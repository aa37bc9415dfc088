"""The Jupyter messages the pool reads, typed at the protocol boundary."""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_DELIMITER = b"<IDS|MSG>"

RESET_MSG_TYPE = "kernel_pool_reset"
"""The IOPub message in which a kernel reports the reset it ran after a lease's last cell."""
STREAM_DROPPED_MSG_TYPE = "kernel_pool_stream_dropped"
"""The output in which a kernel reports what it did not publish past an execution's
``stream_cap``: ``{"stdout": n, "stderr": m}`` in characters (read it with
:func:`dropped_characters`)."""
_STREAMS = ("stdout", "stderr")


@dataclass(frozen=True, slots=True)
class Output:
    """One IOPub message produced by an execution (or a custom message from in-kernel code)."""

    msg_type: str
    content: Mapping[str, Any]
    buffers: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class ExecuteResult:
    """What an ``execute_request`` produced: its reply and, unless streamed, its outputs."""

    reply: Mapping[str, Any]
    outputs: tuple[Output, ...]
    duration_seconds: float
    msg_id: str = ""
    """The request's id (its reply and outputs name it as their parent)."""

    @property
    def ok(self) -> bool:
        return self.reply.get("status") == "ok"

    @property
    def user_expressions(self) -> Mapping[str, Any]:
        value = self.reply.get("user_expressions") or {}
        return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True, slots=True)
class InlineReset:
    """The verdict of the reset a kernel ran right after a lease's last cell."""

    problems: tuple[str, ...]
    seconds: float
    # helper processes a library keeps for the life of the kernel (a resource tracker)
    library_processes: tuple[int, ...] = ()

    @classmethod
    def from_content(cls, content: Mapping[str, Any]) -> InlineReset:
        problems = content.get("problems")
        if not isinstance(problems, list):
            problems = ["the kernel's reset report is malformed"]
        seconds = content.get("seconds")
        return cls(
            tuple(str(p) for p in problems),
            float(seconds) if isinstance(seconds, int | float) else 0.0,
            library_pids(content),
        )


def dropped_characters(content: Mapping[str, Any]) -> dict[str, int]:
    """``{stream name: characters}`` of a :data:`STREAM_DROPPED_MSG_TYPE` output: only the
    two standard streams, and only counts that are whole numbers above zero."""
    dropped: dict[str, int] = {}
    for name in _STREAMS:
        count = content.get(name)
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            dropped[name] = count
    return dropped


def library_pids(report: Mapping[str, Any]) -> tuple[int, ...]:
    """The pids a reset report names as a library's own helper processes."""
    pids = report.get("library_processes")
    if not isinstance(pids, list):
        return ()
    return tuple(pid for pid in pids if isinstance(pid, int) and not isinstance(pid, bool))


def decode(frames: Sequence[bytes], auth: hmac.HMAC | None) -> dict[str, Any]:
    """A message as received from a kernel's socket, its HMAC checked (wire protocol 5).

    What the pool needs of ``Session.deserialize``, without its date parsing or its
    ever-growing history of seen signatures: a replayed message is harmless here, because
    only messages whose parent is the request in flight are read, and each once.
    Raises ``ValueError`` for a malformed or wrongly signed message.
    """
    try:
        start = frames.index(_DELIMITER) + 1
    except ValueError:
        raise ValueError("no message delimiter") from None
    parts = frames[start:]
    if len(parts) < 5:
        raise ValueError(f"malformed message: {len(parts)} parts")
    if auth is not None:
        mac = auth.copy()
        for part in parts[1:5]:
            mac.update(part)
        if not hmac.compare_digest(parts[0], mac.hexdigest().encode("ascii")):
            raise ValueError("invalid message signature")
    header = _loads(parts[1])
    return {
        "header": header,
        "msg_id": header.get("msg_id"),
        "msg_type": header.get("msg_type"),
        "parent_header": _loads(parts[2]),
        "metadata": _loads(parts[3]),
        "content": _loads(parts[4]),
        "buffers": list(parts[5:]),
    }


def _loads(part: bytes) -> Any:
    """JSON from a kernel. ipykernel writes a lone surrogate that stands for a byte (text
    decoded with ``surrogateescape``, such as a file name that is not UTF-8) as that byte,
    which is not UTF-8: it is read as U+FFFD rather than losing the whole message."""
    try:
        return json.loads(part)
    except UnicodeDecodeError:
        return json.loads(part.decode("utf-8", "replace"))
