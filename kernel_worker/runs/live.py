"""A running cell's console as it arrives, for a client that watches it run.

The bundle's console is kept by :mod:`.console`; :class:`LiveConsole` keeps only the last
:data:`TAIL_CHARS` characters of each stream, with the offset of every character counted
from the stream's start, so a watcher asks for what came after the last offset it saw
(``GET /v1/executions/{build_id}/console``) and can tell when it missed some.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["STREAMS", "TAIL_CHARS", "LiveConsole", "LiveText"]

TAIL_CHARS = 64 * 1024
"""Characters of each stream kept for watchers (older ones are dropped)."""
STREAMS = ("stdout", "stderr")


@dataclass(frozen=True, slots=True)
class LiveText:
    """Characters ``start`` (inclusive) to ``end`` (exclusive) of one stream."""

    text: str
    start: int
    end: int


class _Tail:
    __slots__ = ("end", "pieces", "start")

    def __init__(self) -> None:
        self.pieces: deque[str] = deque()
        self.start = 0  # offset of the first kept character
        self.end = 0  # offset after the last character seen

    def append(self, text: str) -> None:
        self.pieces.append(text)
        self.end += len(text)
        while self.end - self.start > TAIL_CHARS:
            first = self.pieces[0]
            excess = self.end - self.start - TAIL_CHARS
            if len(first) <= excess:
                self.pieces.popleft()
                self.start += len(first)
            else:
                self.pieces[0] = first[excess:]
                self.start += excess

    def since(self, offset: int) -> LiveText:
        begin = max(offset, self.start)
        if begin >= self.end:
            return LiveText("", self.end, self.end)
        text = "".join(self.pieces)[begin - self.start :]
        return LiveText(text, begin, self.end)


class LiveConsole:
    """The tails of one execution's stdout and stderr; ``append`` is its console listener."""

    __slots__ = ("_tails",)

    def __init__(self) -> None:
        self._tails = {name: _Tail() for name in STREAMS}

    def append(self, stream: str, text: str) -> None:
        tail = self._tails.get(stream)
        if tail is not None and text:
            tail.append(text)

    def since(self, stream: str, offset: int) -> LiveText:
        """What ``stream`` held after character ``offset`` (from the oldest still kept)."""
        return self._tails[stream].since(max(0, offset))
