"""A run's Jupyter displays against the display caps, and the files the agent wrote for them.

The in-kernel agent (``agent/display_files``) writes every large format of a display into
the run directory (``display/s<n><ext>``) and sends a marker instead of the bytes, and drops
a display over the caps, sending a ``text/plain`` note. Here the worker reads those markers:

- :meth:`DisplayCaps.kept` holds the displays a run keeps to the caps again, whatever a
  kernel sent (a cell can reach the kernel's socket itself): in order, a display over the
  cap on one display, or one that takes the kept bytes past the cap on a run's displays, is
  replaced by the same note the agent sends;
- :func:`written_files` and :func:`dropped` read a display's marker, and
  :func:`verified_file` accepts a written file only as the agent described it (a regular
  file of the ``display/`` folder, reached through no link, of the size it announced).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from ..agent import display_files
from ..agent.plan import DisplayLimits
from . import files as run_files

__all__ = ["DisplayCaps", "JupyterDisplay", "dropped", "verified_file", "written_files"]

MARKER = display_files.MARKER
_FOLDER = "display"
_WRITTEN_NAME = re.compile(r"s\d{1,9}\.[a-z]{2,4}")
_BINARY = frozenset({"image/png", "image/jpeg", "image/gif", "application/pdf"})


@dataclass(frozen=True, slots=True)
class JupyterDisplay:
    """One display a Jupyter user would see: its mime bundle and where it came from."""

    output_type: str
    data: Mapping[str, Any]
    metadata: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class DisplayCaps:
    """Bytes one display may hold (all its formats), and all the displays a run keeps."""

    display_bytes: int
    run_display_bytes: int

    def kept(self, displays: Sequence[JupyterDisplay]) -> list[JupyterDisplay]:
        """``displays`` with each one over the caps replaced by a note (in order)."""
        caps = DisplayLimits(
            display_bytes=self.display_bytes, run_display_bytes=self.run_display_bytes
        )
        kept: list[JupyterDisplay] = []
        total = 0
        for display in displays:
            size = _size(display)
            over = display_files.over(caps, size, total)
            if over is None:
                total += size
                kept.append(display)
            else:
                note = {"text/plain": display_files.note(over)}
                marker = {MARKER: {"dropped": over}}
                kept.append(dataclasses.replace(display, data=note, metadata=marker))
        return kept


def written_files(display: JupyterDisplay) -> dict[str, tuple[str, int]]:
    """``{mime: (file name, bytes)}`` of the formats the agent wrote as files."""
    files = _marker(display).get("files")
    if not isinstance(files, dict):
        return {}
    found: dict[str, tuple[str, int]] = {}
    for mime, entry in files.items():
        if not isinstance(entry, dict):
            continue
        name, size = entry.get("file"), entry.get("bytes")
        if isinstance(name, str) and _WRITTEN_NAME.fullmatch(name) and _is_size(size):
            found[str(mime)] = (name, size)
    return found


def dropped(display: JupyterDisplay) -> dict[str, object] | None:
    """``{"bytes", "cap", "limit"}`` when the display stands for one dropped by the caps."""
    entry = _marker(display).get("dropped")
    if not isinstance(entry, dict):
        return None
    size, cap, limit = entry.get("bytes"), entry.get("cap"), entry.get("limit")
    if not (_is_size(size) and _is_size(cap) and isinstance(limit, str)):
        return None
    return {"bytes": size, "cap": cap, "limit": limit}


def verified_file(run_root: Path, name: str, size: int) -> bool:
    """Whether ``display/<name>`` is a regular file of ``size`` bytes (blocking)."""
    try:
        with run_files.open_regular(run_root, [_FOLDER, name]) as fh:
            return os.fstat(fh.fileno()).st_size == size
    except OSError:
        return False


def _marker(display: JupyterDisplay) -> Mapping[str, Any]:
    marker = display.metadata.get(MARKER) if isinstance(display.metadata, Mapping) else None
    return marker if isinstance(marker, dict) else {}


def _is_size(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _size(display: JupyterDisplay) -> int:
    """The bytes a display adds: its written files as announced, its other formats as they
    would be written (base64 decoded, text as UTF-8, JSON as text)."""
    files = written_files(display)
    total = 0
    for mime, value in display.data.items():
        if mime in files:
            total += files[mime][1]
            continue
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            value = "".join(value)
        if isinstance(value, str):
            total += len(value) * 3 // 4 if mime in _BINARY else len(value)
        else:
            total += len(json.dumps(value, indent=2, default=str))
    return total
