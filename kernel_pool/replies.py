"""Reading one request's answer from a kernel's event queue: its reply, its outputs and its
idle status, with what was lost on the way said where the cell's output goes."""

from __future__ import annotations

import ast
import asyncio
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from .channels import UNREADABLE
from .errors import KernelDied, KernelNoReply, KernelStartError
from .messages import RESET_MSG_TYPE, ExecuteResult, InlineReset, Output

__all__ = [
    "OutputCallback",
    "answered_with_iopub",
    "collect",
    "literal",
    "next_event",
    "where_in_cell",
]

_IOPUB_GRACE_SECONDS = 0.25  # after a kernel_info reply, how long its idle status may take

OutputCallback = Callable[[Output], None]


# an execution's idle status without its reply: how long the reply may still take (it is
# sent first, on another socket) before the kernel counts as broken
_NO_REPLY_GRACE_SECONDS = 2.0
_LOST_OUTPUT = (
    "[strata-kernel-worker] an output of this cell was lost: the kernel sent it in a form "
    "that could not be read (did the cell change how json encodes?)\n"
)
_DROPPED_OUTPUT = (
    "[strata-kernel-worker] outputs of this cell were lost: the kernel sent a message "
    "of more than {limit} bytes, the most that is read of one; it was dropped, and this "
    "kernel is replaced\n"
)


def _no_answer(answer: Mapping[str, Any] | None, unreadable: int) -> KernelNoReply:
    if answer is None:
        return KernelNoReply()
    return KernelNoReply(
        f"kernel replied, then its idle status was lost among {unreadable} unreadable messages"
    )


async def next_event(
    events: asyncio.Queue[tuple[str, Any]], within_seconds: float
) -> tuple[str, Any]:
    """The next event: one already queued at once, without a turn of the loop for each (a
    burst is consumed as fast as the socket's reader queues it, so the queue stays about one
    read's worth), else the next to come within ``within_seconds``."""
    if not events.empty():
        return events.get_nowait()
    return await asyncio.wait_for(events.get(), within_seconds)


async def collect(
    events: asyncio.Queue[tuple[str, Any]],
    msg_id: str,
    deadline: float,
    sink: OutputCallback,
    reset_verdicts: dict[str, InlineReset],
    *,
    reply: bool = True,
) -> Mapping[str, Any]:
    """Read ``events`` until ``msg_id``'s reply (unless ``reply`` is False) and its idle
    status arrived, passing each output of it to ``sink``.

    Raises:
        TimeoutError: ``deadline`` passed first.
        KernelDied: The kernel died (the event stays queued for later calls).
        KernelNoReply: An idle status without a reply, or a reply whose idle status was
            lost among unreadable messages, after a grace period.
    """
    answer: Mapping[str, Any] | None = None if reply else {}
    idle = False
    unreadable = 0  # IOPub messages lost: any could have been the idle status
    said: set[int] = set()
    # once idle, the reply (sent before it) is due at once; once replied after a lost
    # message, so is the idle status
    quiet_by = math.inf
    while answer is None or not idle:
        now = time.monotonic()
        if now >= quiet_by:
            raise _no_answer(answer, unreadable)
        remaining = deadline - now
        if remaining <= 0:
            raise TimeoutError
        # Which limit the wait is for is decided here, not by the clock after it: a
        # loop's timer may fire a little before time.monotonic() reaches its time
        # (uvloop's clock is cached, in milliseconds).
        for_the_grace = quiet_by - now < remaining
        try:
            channel, msg = await next_event(events, min(remaining, quiet_by - now))
        except TimeoutError:
            if for_the_grace:
                raise _no_answer(answer, unreadable) from None
            raise
        if channel == "died":
            events.put_nowait((channel, msg))  # stays visible to later calls
            raise KernelDied(msg)
        if channel == UNREADABLE:
            limit = msg.get("oversized")
            if msg["channel"] == "shell" and not limit:  # the reply, badly signed or formed
                raise KernelNoReply("kernel sent an unreadable reply")
            # what was lost (an output, the idle status, or, over the limit on the shell
            # socket, maybe the reply) is said where the cell's output goes
            unreadable += 1
            if not limit:
                sink(Output("stream", {"name": "stderr", "text": _LOST_OUTPUT}, ()))
            elif limit not in said:  # once: a kernel may send thousands
                said.add(limit)
                note = _DROPPED_OUTPUT.format(limit=limit)
                sink(Output("stream", {"name": "stderr", "text": note}, ()))
            if answer is not None:
                quiet_by = min(quiet_by, time.monotonic() + _NO_REPLY_GRACE_SECONDS)
            continue
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue  # left over from an earlier, abandoned execution
        msg_type = msg["header"]["msg_type"]
        if channel == "shell":
            answer = msg["content"]
            if unreadable:
                quiet_by = min(quiet_by, time.monotonic() + _NO_REPLY_GRACE_SECONDS)
        elif msg_type == RESET_MSG_TYPE:  # the reset ran before the reply: keep it
            reset_verdicts[msg_id] = InlineReset.from_content(msg["content"])
        elif msg_type == "status":
            idle = msg["content"].get("execution_state") == "idle"
            if idle and answer is None:
                quiet_by = min(quiet_by, time.monotonic() + _NO_REPLY_GRACE_SECONDS)
        elif msg_type != "execute_input":
            sink(Output(msg_type, msg["content"], tuple(msg.get("buffers") or ())))
    return answer


async def answered_with_iopub(
    events: asyncio.Queue[tuple[str, Any]], msg_id: str, deadline: float, kernel_id: str
) -> bool:
    """Whether ``msg_id`` (a ``kernel_info_request``) got its reply and then its idle status:
    False when the idle status did not follow soon (the IOPub subscription was not
    connected yet: ask again)."""
    replied = idle = False
    iopub_by = deadline
    while not (replied and idle):
        remaining = min(deadline, iopub_by) - time.monotonic()
        if remaining <= 0:
            if replied:
                return False  # answered, but IOPub was not connected yet: ask again
            raise KernelStartError(f"kernel {kernel_id} did not become ready in time")
        try:
            channel, msg = await asyncio.wait_for(events.get(), remaining)
        except TimeoutError:
            continue
        if channel == "died":
            raise KernelStartError(f"kernel {kernel_id} exited during start-up (exit status {msg})")
        if channel == UNREADABLE and msg.get("oversized"):
            continue  # what it dropped may be asked again (and the kernel is retired)
        if channel == UNREADABLE:
            raise KernelStartError(
                f"kernel {kernel_id} sent an unreadable {msg['channel']} message"
            )
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if channel == "shell":
            replied = True
            iopub_by = time.monotonic() + _IOPUB_GRACE_SECONDS
        elif msg["header"]["msg_type"] == "status":
            idle = idle or msg["content"].get("execution_state") == "idle"
    return True


def literal(result: ExecuteResult, key: str) -> Any:
    """Decode a user_expression whose value is a Python literal (dict, list, str...)."""
    entry = result.user_expressions.get(key) or {}
    if entry.get("status") != "ok":
        raise RuntimeError(f"{entry.get('ename', 'error')}: {entry.get('evalue', '')}")
    return ast.literal_eval(entry["data"]["text/plain"])


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CELL_FRAME = re.compile(
    r'^\s*(?:Cell In\[\d+\]|File "<cell>"), line (\d+)(?:, in ([^\s(]+))?', re.MULTILINE
)


def where_in_cell(traceback: object) -> str | None:
    """``line N, in F`` of the innermost frame of the code run (IPython's traceback names it
    ``Cell In[1]``, a worker's agent ``"<cell>"``), for a start-up failure's message; None
    when there is none."""
    if not isinstance(traceback, list):
        return None
    text = _ANSI.sub("", "\n".join(str(part) for part in traceback))
    frames = _CELL_FRAME.findall(text)
    if not frames:
        return None
    line, function = frames[-1]
    return f"line {line}" if function in ("", "<module>") else f"line {line}, in {function}"
