"""IOPub messages → console, displays and error: a pure reducer over plain data.

Feed it every output of one execution in order (:meth:`OutputReducer.feed`); read the
console, the Jupyter displays a notebook user would see, and the cell's error at the end.
Each stream keeps at most the console cap (see :mod:`.console`), whatever the kernel sends;
what the kernel itself dropped past the cap it asked for counts toward the truncation
marker the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kernel_pool import STREAM_DROPPED_MSG_TYPE, Output, dropped_characters

from .console import ConsoleBuffer, ConsoleText
from .displays import DisplayCaps, JupyterDisplay

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
DEFAULT_CONSOLE_CAP = 16 * 1024 * 1024
ConsoleListener = Callable[[str, str], None]
"""Receives ``(stream name, text)`` for every console chunk kept, in order."""


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


@dataclass(frozen=True, slots=True)
class CellError:
    ename: str
    evalue: str
    traceback: str


class OutputReducer:
    """Accumulates one execution's outputs; ``displays`` are the display caps, held to
    whatever the kernel sent (see display_limits)."""

    def __init__(
        self,
        console_cap: int = DEFAULT_CONSOLE_CAP,
        console: ConsoleListener | None = None,
        *,
        displays: DisplayCaps | None = None,
    ) -> None:
        self._streams = {"stdout": ConsoleBuffer(console_cap), "stderr": ConsoleBuffer(console_cap)}
        self._console = console
        self._displays: list[JupyterDisplay] = []
        self._display_caps = displays
        self._display_ids: dict[str, list[int]] = {}
        self._clear_pending = False
        self.error: CellError | None = None

    def feed(self, output: Output) -> None:
        if output.msg_type == STREAM_DROPPED_MSG_TYPE:
            for name, characters in dropped_characters(output.content).items():
                self._streams[name].drop(characters)
            return
        handler = getattr(self, f"_on_{output.msg_type}", None)
        if handler is not None:
            handler(output.content)

    def _apply_pending_clear(self) -> None:
        if self._clear_pending:
            self._clear_pending = False
            self._displays.clear()
            self._display_ids.clear()

    def _on_stream(self, content: Mapping[str, Any]) -> None:
        self._apply_pending_clear()
        name = str(content.get("name"))
        stream = self._streams.get(name)
        if stream is not None:
            kept = stream.add(str(content.get("text", "")))
            if kept and self._console is not None:
                self._console(name, kept)

    def _on_display_data(self, content: Mapping[str, Any]) -> None:
        self._add_display("display_data", content)

    def _on_execute_result(self, content: Mapping[str, Any]) -> None:
        self._add_display("execute_result", content)

    def _add_display(self, output_type: str, content: Mapping[str, Any]) -> None:
        self._apply_pending_clear()
        display = JupyterDisplay(
            output_type, dict(content.get("data") or {}), dict(content.get("metadata") or {})
        )
        display_id = (content.get("transient") or {}).get("display_id")
        if display_id:
            self._display_ids.setdefault(str(display_id), []).append(len(self._displays))
        self._displays.append(display)

    def _on_update_display_data(self, content: Mapping[str, Any]) -> None:
        display_id = str((content.get("transient") or {}).get("display_id", ""))
        for index in self._display_ids.get(display_id, ()):
            old = self._displays[index]
            self._displays[index] = JupyterDisplay(
                old.output_type,
                dict(content.get("data") or {}),
                dict(content.get("metadata") or {}),
            )

    def _on_clear_output(self, content: Mapping[str, Any]) -> None:
        self._clear_pending = True
        if not content.get("wait"):
            self._apply_pending_clear()

    def _on_error(self, content: Mapping[str, Any]) -> None:
        frames = [strip_ansi(str(line)) for line in content.get("traceback") or ()]
        self.error = CellError(
            str(content.get("ename", "Error")), str(content.get("evalue", "")), "\n".join(frames)
        )

    @property
    def stdout(self) -> ConsoleText:
        return self._streams["stdout"].text()

    @property
    def stderr(self) -> ConsoleText:
        return self._streams["stderr"].text()

    @property
    def displays(self) -> list[JupyterDisplay]:
        """What a notebook would show, in order; a display over the caps is a note instead."""
        if self._display_caps is None:
            return list(self._displays)
        return self._display_caps.kept(self._displays)
