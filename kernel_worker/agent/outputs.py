"""Collecting a cell's outputs: the names it bound and what it displayed, written to the
run's files folder, and the report (metadata, previews, mutation warnings) beside them.

Previews are bounded so the report stays small; the values are whole in their files.
Stdlib only at import time.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
from collections.abc import Iterator
from typing import Any

from . import codecs, display_files, rundir
from .run_state import state

_SKIPPED_NAMES = frozenset(("__builtins__", "__name__", "__doc__", "__package__"))
PREVIEW_LIMIT = 64 * 1024
INLINE_IMAGE_LIMIT = 16 * 1024 * 1024
_json_dumps = json.JSONEncoder(default=repr).encode  # immune to a cell patching json.dumps


def _is_output(name: str, value_id: Any, run: Any) -> Any:
    if name.startswith("_") or name in _SKIPPED_NAMES:
        return False
    if name in run.plan.mutation_defines:
        return True
    return run.before.get(name) != value_id or name in run.rebound


def _serialize(name: str, value: Any, files_dir: str, for_display: bool = False) -> Any:
    try:
        meta = codecs.serialize(name, value, files_dir, for_display=for_display)
    except Exception as exc:  # a codec bug must not lose the other outputs
        return {"error": f"{type(exc).__name__}: {exc}", "type": type(value).__name__}
    _bound_preview(meta)
    return meta


def _bound_preview(meta: Any) -> None:
    """Keep the manifest small: a preview is for display, the value itself is in its file."""
    url = meta.get("inline_data_url")
    if isinstance(url, str) and len(url) > INLINE_IMAGE_LIMIT:
        del meta["inline_data_url"]  # the image is still whole in its file
        meta["inline_data_url_omitted"] = True
    preview = meta.get("preview")
    if preview is None or isinstance(preview, (bool, int, float)):
        return
    text = preview if isinstance(preview, str) else None
    if text is None:
        try:
            size = len(_json_dumps(preview))
        except (TypeError, ValueError):
            return
        if size <= PREVIEW_LIMIT:
            return
        meta["preview"] = _trimmed(preview, PREVIEW_LIMIT)  # the same shape, fewer items
        meta["preview_truncated"] = True
        return
    if len(text) > PREVIEW_LIMIT:
        meta["preview"] = text[:PREVIEW_LIMIT] + "…"
        meta["preview_truncated"] = True
    elif text is not preview:
        meta["preview"] = text
        meta["preview_truncated"] = True


def _trimmed(value: Any, budget: int) -> Any:
    """``value`` (JSON data) cut to about ``budget`` characters of JSON, keeping its shape:
    a list keeps its leading items that fit whole (a table preview, its first rows), a
    dict its leading entries, a string its start; an item that alone does not fit is cut
    the same way and ends the container."""
    if isinstance(value, str):
        return value if len(value) <= budget else value[: max(budget, 0)] + "…"
    if isinstance(value, list):
        kept: list[Any] = []
        used = 2
        for item in value:
            size = len(_json_dumps(item)) + 2
            if used + size > budget:
                if not kept:
                    kept.append(_trimmed(item, budget - used))
                break
            kept.append(item)
            used += size
        return kept
    if isinstance(value, dict):
        entries, used = {}, 2
        for key, item in value.items():
            size = len(_json_dumps(key)) + len(_json_dumps(item)) + 4
            if used + size > budget:
                entries[key] = _trimmed(item, budget - used - len(_json_dumps(key)) - 4)
                break
            entries[key] = item
            used += size
        return entries
    return value


def _collect_variables(ns: dict[str, Any], run: Any, files_dir: str) -> Any:
    variables = {}
    values = {}
    for name, value in list(ns.items()):
        if _is_output(name, id(value), run):
            variables[name] = _serialize(name, value, files_dir)
            values[name] = value
    return variables, values


def _collect_displays(shell: Any, run: Any, variables: Any, values: Any, files_dir: str) -> Any:
    result = getattr(shell.last_execution_result, "result", None)
    shown = list(run.displays)
    if result is not None:
        shown.append(result)
    displays = []
    for index, obj in enumerate(shown):
        displays.append(_display_entry(index, obj, variables, values, files_dir))
    return displays


def _display_entry(index: Any, obj: Any, variables: Any, values: Any, files_dir: str) -> Any:
    """A display that is a variable of the same content type reuses that variable's file."""
    for name, value in values.items():
        if value is obj and "error" not in variables[name]:
            kind = codecs.detect_content_type(obj, for_display=True)
            if variables[name].get("content_type") == kind:
                return dict(variables[name])
    return _serialize(f"__display__{index}", obj, files_dir, for_display=True)


@contextlib.contextmanager
def silenced() -> Iterator[Any]:
    """What serializing outputs prints or warns (pandas on mixed-type column names, a
    ``__reduce__`` that prints) is not the cell's output: the reference's cell process
    serializes after its capture of stdout and stderr has ended."""
    sink = io.StringIO()
    with (
        contextlib.redirect_stdout(sink),
        contextlib.redirect_stderr(sink),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        yield


def collect(run: Any) -> None:
    """Serialize the cell's outputs and displays; write the report next to them."""
    shell = state["shell"]
    files_dir = run.plan.files_dir
    if not rundir.real_folder(files_dir):  # the worker says what the cell did to it
        raise RuntimeError("the outputs' folder is no longer the worker's")
    left = rundir.set_aside_contents(files_dir)  # nothing is written through the cell's links
    folder = os.path.basename(files_dir)
    displaced = {f"{folder}/{name}": mode for name, mode in left.items()}
    ns = shell.user_ns
    variables, values = _collect_variables(ns, run, files_dir)
    displays = _collect_displays(shell, run, variables, values, files_dir)
    displays = display_files.checked(displays, files_dir, run.plan)  # the caps, files shared
    if displays:
        variables["_"] = displays[-1]
    warnings = codecs.mutation_warnings(run.fingerprints, ns, set(run.inputs), values)
    report = {
        "variables": variables,
        "displays": displays,
        "mutation_warnings": warnings,
        "build_env": codecs.build_env(),
    }
    write_report(run.plan.report_path, report, displaced)


def write_report(path: str, report: Any, displaced: Any = None) -> None:
    """The report as a new file; ``displaced`` (``{where: st_mode}``) tells the worker what
    the cell left where the agent writes, set aside (what held the report's name too)."""
    fd, mode = rundir.create_new(path)
    displaced = dict(displaced or {})
    if mode is not None:
        displaced[os.path.basename(path)] = mode
    if displaced:
        report["displaced"] = displaced
    with open(fd, "w", encoding="utf-8") as fh:
        fh.write(_json_dumps(report))
