"""The cell's Jupyter displays as files in its run directory, one per mime type.

The IOPub reducer (``messages``) holds each display the kernel sent; after the cell,
:func:`mime_files` writes every format of every display as ``display/<index><ext>`` and
returns one :class:`MimeDisplay` per file, which the bundle then carries. A format the agent
already wrote as a file (a large one, see ``agent.display_files``) is that file. The cell can
write in the display folder too: nothing it left there is written through, and a folder it
broke loses the displays (told as a :class:`~.layout.Damage`), never the run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..agent.display_files import EXTENSIONS, base64_bytes
from ..errors import storage_checked
from . import displays as display_limits
from . import files as run_files
from . import layout
from .directory import DISPLAY_FOLDER
from .displays import JupyterDisplay

__all__ = ["MimeDisplay", "mime_files", "write_jupyter_displays"]

_BINARY_MIME = frozenset({"image/png", "image/jpeg", "image/gif", "application/pdf"})


@dataclass(frozen=True, slots=True)
class MimeDisplay:
    """One IPython display output's mime file, already written under ``run_dir/display``."""

    file: str  # basename inside run_dir/display, e.g. "0.png"
    content_type: str  # e.g. "image/png", "text/html"
    index: int  # which display output (0, 1, …); one output may have several mime files
    output_type: str  # "display_data" or "execute_result"
    # set when this is the note that stands for a display over the caps: {bytes, cap, limit}
    dropped: Mapping[str, object] | None = None


def mime_files(
    displays: Sequence[JupyterDisplay], run_root: Path, damages: list[layout.Damage]
) -> list[MimeDisplay]:
    """The displays' mime files, unless the cell broke their folder (then none; a folder
    broken while they are written, by a process the cell left, is added to ``damages``)."""
    where = f"{DISPLAY_FOLDER}/"
    if not displays or any(damage.where == where for damage in damages):
        return []
    displaced: dict[str, int] = {}
    try:
        with storage_checked("the cell's displays"):
            written = write_jupyter_displays(displays, run_root, displaced)
        damages.extend(layout.set_aside(displaced))
        return written
    except OSError:
        lost = layout.DISPLAYS_LOST
        damage = layout.damage_to(run_root, (DISPLAY_FOLDER,), lost)
        damages.append(damage or layout.Damage(where, "something else", lost))
        return []


def write_jupyter_displays(
    displays: Sequence[JupyterDisplay], run_root: Path, displaced: dict[str, int] | None = None
) -> list[MimeDisplay]:
    """Write every mime type of every display as ``display/<index><ext>`` in the run
    directory ``run_root``, each a new file (blocking: use a thread). A format the agent
    wrote as a file itself is that file, if it is as the agent described it (else left out).

    The cell can write in that folder too: whatever it left at a name (a link to a file only
    the worker may write, a FIFO, a folder) is moved aside, never written through (see
    run_files), and told to ``displaced``.
    """
    written: list[MimeDisplay] = []
    for index, display in enumerate(displays):
        files, dropped = display_limits.written_files(display), display_limits.dropped(display)
        for mime, value in display.data.items():
            if mime in files:  # the agent wrote it (see display_limits)
                name, size = files[mime]
                if display_limits.verified_file(run_root, name, size):
                    written.append(MimeDisplay(name, mime, index, display.output_type))
                continue
            ext = EXTENSIONS.get(mime, ".json" if mime.endswith("json") else ".bin")
            name = f"{index}{ext}" if ext != ".bin" else f"{index}-{len(written)}.bin"
            with run_files.create(run_root, [DISPLAY_FOLDER, name], displaced) as fh:
                fh.write(_mime_bytes(mime, value))
            written.append(MimeDisplay(name, mime, index, display.output_type, dropped))
    return written


def _mime_bytes(mime: str, value: object) -> bytes:
    """A display's value as its file's bytes. Text is UTF-8 (a lone surrogate becomes U+FFFD);
    a binary type's base64 is decoded, and one that is not base64 (a repr method's own
    text) is kept as the text it came as."""
    if mime in _BINARY_MIME and isinstance(value, str):
        raw = base64_bytes(value)
        if raw is not None:
            return raw
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = "".join(value)
    if isinstance(value, str):
        return value.encode("utf-8", "replace")
    return json.dumps(value, indent=2).encode("utf-8")
