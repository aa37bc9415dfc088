"""A cell's stdout and stderr as the worker keeps them: at most a cap per stream, held once.

:class:`ConsoleBuffer` keeps at most ``cap`` characters of one stream of one execution, in
the pieces they arrived in (small ones joined in batches, so a flood of one-character
messages does not cost an object each), and counts the characters it does not keep,
together with those the kernel reports it dropped itself (kernel_pool's ``stream_cap``).

:meth:`ConsoleBuffer.text` is a :class:`ConsoleText`: the kept pieces and, when anything
was dropped, the truncation marker, never joined into one string. Joining a full console
(16 M characters by default) held it twice for a moment; the bundle instead writes it a
chunk at a time (:func:`utf8_chunks`, :func:`json_chunks`), each byte for byte what
encoding the whole text at once gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii

HELD = 1 << 20
"""Characters of a stream held as one string, at least (the last one excepted)."""
CHUNK = 1 << 18
"""Characters encoded at a time when a console is written out."""
_PENDING_PIECES = 1024  # smaller pieces waiting to make up a chunk: joined past this many


def truncation_marker(dropped: int) -> str:
    """What follows a stream's kept text when ``dropped`` characters were not kept."""
    return f"\n[output truncated: {dropped} more characters not kept]\n"


@dataclass(frozen=True, slots=True)
class ConsoleText:
    """One stream's text as pieces, in order (their concatenation is the text)."""

    pieces: tuple[str, ...] = ()

    def __str__(self) -> str:
        return "".join(self.pieces)

    def __len__(self) -> int:
        return sum(map(len, self.pieces))

    def __add__(self, other: str) -> ConsoleText:
        return ConsoleText((*self.pieces, other)) if other else self


Text = str | ConsoleText
"""A console stream as a bundle takes it."""


class ConsoleBuffer:
    """Accumulates one stream of one execution, keeping at most ``cap`` characters.

    What is kept is held in strings of at least :data:`HELD` characters: pieces that
    arrive smaller wait (joined every :data:`_PENDING_PIECES`, so many tiny messages do
    not cost an object each) until they make up one. Held that way, a console's memory is
    what it holds, whatever the sizes of the messages it came in (large strings get pages
    of their own, returned when they are freed, where small ones share the heap with
    everything the worker allocates for a moment).
    """

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._chunks: list[str] = []
        self._pending: list[str] = []
        self._pending_size = 0
        self.size = 0
        """Characters kept."""
        self.dropped = 0
        """Characters not kept (here, or by the kernel)."""

    def add(self, text: str) -> str:
        """Keep what fits of ``text``; returns what was kept (``""`` when nothing was)."""
        room = self._cap - self.size
        if len(text) > room:
            self.dropped += len(text) - room
            text = text[:room]
        if not text:
            return text
        self.size += len(text)
        if len(text) >= HELD:
            self._settle()
            self._chunks.append(text)
            return text
        self._pending.append(text)
        self._pending_size += len(text)
        if self._pending_size >= HELD:
            self._settle()
        elif len(self._pending) >= _PENDING_PIECES:
            self._pending[:] = ["".join(self._pending)]
        return text

    def drop(self, characters: int) -> None:
        """Count ``characters`` the kernel did not send."""
        self.dropped += characters

    def text(self) -> ConsoleText:
        """The kept text, followed by the truncation marker if anything was dropped."""
        self._settle()
        marker = (truncation_marker(self.dropped),) if self.dropped else ()
        return ConsoleText((*self._chunks, *marker))

    def _settle(self) -> None:
        if self._pending:
            self._chunks.append("".join(self._pending))
            self._pending.clear()
            self._pending_size = 0


def pieces(text: Text) -> tuple[str, ...]:
    return (text,) if isinstance(text, str) else text.pieces


def _windows(text: Text) -> Iterator[str]:
    for piece in pieces(text):
        if len(piece) <= CHUNK:
            yield piece
        else:
            for start in range(0, len(piece), CHUNK):
                yield piece[start : start + CHUNK]


def _utf8(window: str) -> bytes:
    return window.encode("utf-8", "replace")  # a lone surrogate becomes "?"


def utf8_size(text: Text) -> int:
    """``len(str(text).encode("utf-8", "replace"))``, computed a chunk at a time."""
    return sum(len(w) if w.isascii() else len(_utf8(w)) for w in _windows(text))


def utf8_chunks(text: Text) -> Iterator[bytes]:
    """``str(text).encode("utf-8", "replace")``, a chunk at a time."""
    for window in _windows(text):
        yield _utf8(window)


def _quoted(window: str) -> bytes:
    """``json.dumps(window)`` as bytes: each character escapes on its own, so the windows'
    escapes, quotes left out, add up to the whole text's."""
    return encode_basestring_ascii(window).encode("ascii")


def json_size(text: Text) -> int:
    """The length of ``json.dumps(str(text))``, computed a chunk at a time."""
    return 2 + sum(len(_quoted(w)) - 2 for w in _windows(text))


def json_chunks(text: Text) -> Iterator[bytes | memoryview]:
    """``json.dumps(str(text)).encode()`` (a JSON string, quotes included), in chunks."""
    yield b'"'
    for window in _windows(text):
        yield memoryview(_quoted(window))[1:-1]
    yield b'"'
