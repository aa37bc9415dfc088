"""What a kernel sent that the pool waits for: one queue of events per kernel, and only that.

A kernel's connections are read as messages arrive, whether or not a request is waiting
(see ``channels.py``); what nobody will read must not stay queued until a later request
drains it. A cell can send extra replies on the shell socket, or publish from a thread
after its request ended: those piled up in the worker's memory (8 replies of 250 MiB each
were still held after the request). So a message is dropped as it arrives unless it is
awaited:

- a reply only to a request that waits for one, and only one reply per request;
- an IOPub message only of the latest request, and only while someone reads the queue
  (a request's answer, the start's readiness check, the wait for a reset's verdict); the
  verdict of a reset that arrives while nobody reads is kept aside for its reader;
- a kernel's death always (``"died"`` is queued by the kernel itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from .channels import UNREADABLE
from .messages import RESET_MSG_TYPE, InlineReset

log = logging.getLogger(__name__)


class Inbox:
    """Filters what a kernel's channels deliver into its event queue."""

    def __init__(
        self, events: asyncio.Queue[tuple[str, Any]], verdicts: dict[str, InlineReset]
    ) -> None:
        self._events = events
        self._verdicts = verdicts
        self._replies: set[str] = set()  # requests whose reply has not arrived yet
        self._latest: str | None = None  # the request whose IOPub messages are read
        self._readers = 0
        self.dropped = 0  # messages nobody waited for

    def sent(self, msg_id: str, *, reply: bool) -> None:
        """A request was sent: its messages are awaited from now on (its reply too)."""
        self._latest = msg_id
        if reply:
            self._replies.add(msg_id)

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """While this lasts, someone reads the queue."""
        self._readers += 1
        try:
            yield
        finally:
            self._readers -= 1

    def deliver(self, channel: str, msg: dict[str, Any]) -> None:
        if channel == UNREADABLE:
            if self._readers:
                self._events.put_nowait((channel, msg))
            return
        parent = _parent_id(msg)
        if channel == "shell":
            if parent is None or parent not in self._replies:
                self._drop(channel)
                return
            self._replies.discard(parent)
        elif parent is None or parent != self._latest:
            self._drop(channel)
            return
        elif not self._readers:
            if msg["header"].get("msg_type") == RESET_MSG_TYPE:
                self._verdicts[parent] = InlineReset.from_content(_content(msg))
            else:
                self._drop(channel)
            return
        self._events.put_nowait((channel, msg))

    def _drop(self, channel: str) -> None:
        self.dropped += 1
        log.debug("a kernel's %s message nobody waits for: dropped", channel)


def _parent_id(msg: Mapping[str, Any]) -> str | None:
    """The id of the request ``msg`` answers, when it is well formed enough to be read."""
    header, parent = msg.get("header"), msg.get("parent_header")
    if not isinstance(header, dict) or not isinstance(parent, dict):
        return None
    msg_id = parent.get("msg_id")
    return msg_id if isinstance(msg_id, str) else None


def _content(msg: Mapping[str, Any]) -> Mapping[str, Any]:
    content = msg.get("content")
    return content if isinstance(content, dict) else {}
