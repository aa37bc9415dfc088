"""What an R cell left, as the bundle's variables and displays (the reference's shapes).

The R side reports each output as one of: ``json`` (a file it wrote, ``<name>.json``),
``rds`` (``<name>.rds``, readable by R only), ``frame`` (a frame folder, converted here to
``<name>.arrow``), or ``error``; and its plots as PNG files. Every file is reached without
following links (see :mod:`kernel_worker.runs.files`): the cell could have put one there.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...agent import content_types as formats
from ...runs import files as run_files
from .frames import FRAME_FILE, frame_to_arrow
from .plan import FRAMES_FOLDER, REPORT_FILE

__all__ = ["PLOT_HEIGHT", "PLOT_WIDTH", "displays", "read_report", "variables"]

PLOT_WIDTH = 800
PLOT_HEIGHT = 600
"""The PNG device's size in pixels (``cell.R``)."""
_FILES = "files"


def read_report(root: Path) -> dict[str, Any]:
    """The R side's report (raises ``OSError``/``ValueError`` when there is none to read)."""
    with run_files.open_regular(root, [REPORT_FILE]) as fh:
        report = json.load(fh)
    if not isinstance(report, dict):
        raise ValueError("the report is not an object")
    return report


def variables(root: Path, reported: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each reported output's bundle entry, in the reference's shape."""
    return {str(name): _variable(root, str(name), entry) for name, entry in reported.items()}


def _variable(root: Path, name: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    kind = entry.get("kind")
    try:
        if kind == "frame":
            return _frame(root, name, entry)
        if kind in ("json", "rds"):
            file = str(entry["file"])
            described: dict[str, Any] = {
                "content_type": formats.JSON if kind == "json" else formats.R_OBJECT,
                "file": file,
                "bytes": _size(root, file),
                "preview": entry.get("preview"),
            }
            if kind == "rds":
                described["r_only"] = True
            return described
    except (OSError, ValueError, KeyError, TypeError) as exc:  # (Arrow's errors among them)
        return {"error": f"The output file of '{name}' could not be read: {exc}", "type": kind}
    return {"error": str(entry.get("error", "not written")), "type": str(entry.get("type", ""))}


def _frame(root: Path, name: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    folder = [FRAMES_FOLDER, str(entry["folder"])]

    def read(file: str) -> bytes:
        with run_files.open_regular(root, [*folder, file]) as fh:
            return fh.read()

    meta = json.loads(read(FRAME_FILE))
    file = f"{name}.arrow"
    with run_files.create(root, [_FILES, file]) as out:
        frame_to_arrow(meta, read, out)
        size = out.tell()
    return {
        "content_type": formats.ARROW,
        "file": file,
        "bytes": size,
        "preview": entry.get("preview"),
        "rows": entry.get("rows"),
        "columns": entry.get("columns"),
    }


def _size(root: Path, file: str) -> int:
    with run_files.open_regular(root, [_FILES, file]) as fh:
        return os.fstat(fh.fileno()).st_size


def displays(root: Path, files: object) -> list[dict[str, Any]]:
    """The plots' display entries (a plot that cannot be read is left out)."""
    shown: list[dict[str, Any]] = []
    for file in files if isinstance(files, list) else []:
        try:
            with run_files.open_regular(root, [_FILES, str(file)]) as fh:
                data = fh.read()
        except (OSError, ValueError):
            continue
        shown.append(
            {
                "content_type": formats.PNG,
                "file": str(file),
                "bytes": len(data),
                "inline_data_url": "data:image/png;base64," + base64.b64encode(data).decode(),
                "width": PLOT_WIDTH,
                "height": PLOT_HEIGHT,
                "preview": None,
            }
        )
    return shown
