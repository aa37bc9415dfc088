"""The Jupyter messages the pool reads, typed at the protocol boundary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RESET_PAYLOAD_SOURCE = "kernel_pool.reset"
"""The reply payload in which a kernel reports the reset it ran after the cell."""


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

    @property
    def reset_report(self) -> InlineReset | None:
        """The reset the kernel ran right after the cell (``reset_after``), if it ran one."""
        for entry in self.reply.get("payload") or ():
            if isinstance(entry, Mapping) and entry.get("source") == RESET_PAYLOAD_SOURCE:
                problems = entry.get("problems")
                if not isinstance(problems, list):
                    problems = ["the kernel's reset report is malformed"]
                seconds = entry.get("seconds")
                return InlineReset(
                    tuple(str(p) for p in problems),
                    float(seconds) if isinstance(seconds, int | float) else 0.0,
                )
        return None


@dataclass(frozen=True, slots=True)
class InlineReset:
    """The verdict of a reset the kernel ran in the same round trip as the cell."""

    problems: tuple[str, ...]
    seconds: float
