"""The Jupyter messages the pool reads, typed at the protocol boundary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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

    @property
    def ok(self) -> bool:
        return self.reply.get("status") == "ok"

    @property
    def user_expressions(self) -> Mapping[str, Any]:
        value = self.reply.get("user_expressions") or {}
        return value if isinstance(value, Mapping) else {}
