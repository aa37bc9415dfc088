"""An R cell's plan: what the R side binds and where it writes, as one JSON file.

The worker prepares what R cannot read by itself before the kernel is asked to run the
cell: an ``arrow/ipc`` input becomes a frame folder (see :mod:`.frames`), a ``dir/tar``
folder is unpacked within the run's caps. Everything else is named by path and read by the
R side (``cell.R``). An input no R reader can take (a pickle, a Python module) is not a
request error: the R side raises its message as the cell's error, as any failing cell.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from ...agent import archives
from ...agent import content_types as formats
from ...protocol.envelopes import CellRequest, InputSpec
from ...runs import output_dirs
from ...runs.directory import RunDir
from ...runs.limits import RunLimits
from .frames import table_to_frame

__all__ = ["FRAMES_FOLDER", "PLAN_FILE", "REPORT_FILE", "write_plan"]

PLAN_FILE = "r-plan.json"
REPORT_FILE = "r-report.json"
FRAMES_FOLDER = "r-frames"
"""Where the R side writes its data frames' folders (converted to Arrow after the cell)."""
_INPUT_FRAMES = "r-inputs"
_SHAPE_KEY = b"strata.arrow.shape"


def write_plan(
    request: CellRequest,
    run_dir: RunDir,
    mounts: Mapping[str, str],
    folders: tuple[str, ...],
    limits: RunLimits,
) -> Path:
    """Prepare the inputs, make the folders the cell writes to, write the plan; return its
    path (blocking: file work)."""
    (run_dir.root / FRAMES_FOLDER).mkdir()
    inputs = [_planned(spec, index, run_dir, limits) for index, spec in enumerate(request.inputs)]
    plan = {
        "source": request.source,
        "inputs": inputs,
        "paths": {**mounts, **output_dirs.prepare(run_dir.dirs, folders)},
        "env": dict(request.env),
        "work_dir": str(run_dir.work),
        "files_dir": str(run_dir.files),
        "frames_dir": str(run_dir.root / FRAMES_FOLDER),
        "report_path": str(run_dir.root / REPORT_FILE),
        "mutation_defines": list(request.mutation_defines),
    }
    path = run_dir.root / PLAN_FILE
    path.write_text(json.dumps(plan), encoding="utf-8")
    return path


def _planned(spec: InputSpec, index: int, run_dir: RunDir, limits: RunLimits) -> dict[str, Any]:
    path = run_dir.inputs / spec.file
    kind = spec.content_type
    entry: dict[str, Any] = {"name": spec.name, "path": str(path)}
    if kind == formats.JSON:
        return {**entry, "kind": "json"}
    if kind == formats.R_OBJECT:
        return {**entry, "kind": "rds"}
    if kind in (formats.FILE_PATH, formats.MARKDOWN):
        return {**entry, "kind": "path" if kind == formats.FILE_PATH else "text"}
    if kind == formats.ARROW:
        return {**entry, **_frame_input(spec.name, path, run_dir.root / _INPUT_FRAMES, index)}
    if kind == formats.DIR_TAR:
        try:
            folder = archives.unpack(path, limits.folder_input_bytes, limits.folder_input_entries)
        except (archives.ArchiveError, OSError, ValueError) as exc:
            return {**entry, "kind": "refused", "message": f"Cannot unpack '{spec.name}': {exc}"}
        return {**entry, "kind": "path", "path": str(folder)}
    return {**entry, "kind": "refused", "message": _refusal(spec.name, kind)}


def _frame_input(name: str, path: Path, parent: Path, index: int) -> dict[str, Any]:
    try:
        with pa.ipc.open_stream(pa.memory_map(str(path))) as reader:
            table = reader.read_all()
        parent.mkdir(exist_ok=True)
        folder = parent / str(index)
        table_to_frame(table, folder)
    except (pa.ArrowException, OSError, ValueError) as exc:
        return {"kind": "refused", "message": f"Cannot read '{name}' (arrow/ipc) in R: {exc}"}
    planned: dict[str, Any] = {"kind": "frame", "path": str(folder)}
    metadata = table.schema.metadata or {}
    shape = metadata.get(_SHAPE_KEY, b"table").decode("utf-8", "replace")
    if shape != "table":
        planned["note"] = (
            f"'{name}' was made in Python as a {shape}, not a table: R gets it as a "
            "data.frame of its values. Return a DataFrame upstream to pass it as a table."
        )
    return planned


def _refusal(name: str, content_type: str) -> str:
    if content_type == formats.PICKLE:
        return (
            f"Cannot use '{name}' in an R cell: the Python cell that made it stored it as a "
            "pickle (pickle/object), which only Python reads. Return it from that cell as a "
            "DataFrame or Arrow table, or as a JSON value (numbers, strings, lists, dicts)."
        )
    return (
        f"Cannot use '{name}' in an R cell: R has no reader for {content_type}. Return it "
        "from the upstream cell as a DataFrame, or as a JSON value."
    )
