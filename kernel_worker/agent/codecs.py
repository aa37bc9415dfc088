"""How cell inputs are read and cell outputs written, byte-compatible with Strata 0.11.

This module runs inside the Jupyter kernel: it is shipped as source and executed as
``strata_kernel_agent.codecs``. Module-level imports are the standard library only;
everything else is imported where it is used. It picks the format of each value and owns
the JSON, Markdown and PNG formats; the other families live in their own modules:
``arrow_codec``/``arrow_read`` (tables and arrays), ``objects`` (pickles and notebook
modules), ``archives`` (folders), ``mutations`` (the warnings); ``content_types`` names
them all.

Public surface:

- ``file_stem`` / ``extension_for``: the file names both sides agree on.
- ``load_input``: one staged input file to the Python value a cell sees.
- ``detect_content_type`` / ``serialize``: one output value to a file plus metadata.
- ``fingerprint`` / ``mutation_warnings``: advisory warnings about inputs changed in
  place, deleted inputs and outputs that share a mutable object.
- ``build_env``: which interpreter and machine produced the files.

Errors raised while loading::

    CodecError
    ├── UnknownContentTypeError   (also a ValueError)
    └── RArtifactError            (also a RuntimeError; code R_ONLY_ARTIFACT)
    PrecisionError                (from arrow_read; code PRECISION_NARROWED)
    ArchiveError                  (from archives, also a ValueError: a folder input)
    ├── UnsafeArchiveError
    └── ArchiveTooLargeError
"""

from __future__ import annotations

import base64
import io
import json
import platform
import sys
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from . import archives, arrow_codec, arrow_read, display_forms, objects
from .archives import ArchiveTooLargeError, UnsafeArchiveError
from .arrow_codec import removed_on_error
from .arrow_read import X64_NOTE, PrecisionError, x64_was_enabled_here
from .content_types import (
    ARROW,
    CELL_INSTANCE,
    DIR_MANIFEST,
    DIR_TAR,
    FILE_PATH,
    JSON,
    MARKDOWN,
    MODULE_CELL,
    MODULE_IMPORT,
    PICKLE,
    PNG,
    R_OBJECT,
    Metadata,
    extension_for,
    file_stem,
    target,
    written,
)
from .mutations import InputSnapshot, fingerprint, mutation_warnings

__all__ = [
    "X64_NOTE",
    "ArchiveTooLargeError",
    "CodecError",
    "InputSnapshot",
    "PrecisionError",
    "RArtifactError",
    "UnknownContentTypeError",
    "UnsafeArchiveError",
    "build_env",
    "detect_content_type",
    "extension_for",
    "file_stem",
    "fingerprint",
    "load_input",
    "mutation_warnings",
    "serialize",
    "x64_was_enabled_here",
]


class CodecError(Exception):
    """Root of the errors this module raises on purpose."""


class UnknownContentTypeError(CodecError, ValueError):
    """The input's content type has no Python reader."""


class RArtifactError(CodecError, RuntimeError):
    """The input is an R ``saveRDS()`` blob, which Python cannot read.

    Raised without a variable name by ``load_input``; the caller re-raises it with
    ``RArtifactError(err.file_path, variable_name=name)`` so the message names it.
    """

    code = "R_ONLY_ARTIFACT"

    def __init__(self, file_path: str | Path, *, variable_name: str | None = None) -> None:
        self.file_path = Path(file_path)
        self.variable_name = variable_name
        what = f"variable '{variable_name}'" if variable_name else f"artifact at {file_path}"
        super().__init__(
            f"Cannot consume R-only artifact ({what}) from Python: the upstream R cell "
            "stored this value via saveRDS(), which Python cannot read. Re-export the "
            "upstream as a data.frame or tibble (handed across as Arrow IPC) for "
            "cross-language consumption."
        )


# --- Environment --------------------------------------------------------------------


def build_env() -> str:
    """``<implementation>-<major.minor>-<sys.platform>-<machine>``, recorded per result."""
    major, minor = sys.version_info[:2]
    implementation = platform.python_implementation().lower()
    return f"{implementation}-{major}.{minor}-{sys.platform}-{platform.machine()}"


# --- Type detection -----------------------------------------------------------------


def _is_display_name(name: str) -> bool:
    return name == "_" or name.startswith("__display__")


def _json_round_trips(value: object) -> bool:
    """Whether JSON would hand *value* back unchanged (no tuples, only string keys)."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_round_trips(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_json_round_trips(item) for item in value)
    return not isinstance(value, tuple)


def _is_json_value(value: object) -> bool:
    if not isinstance(value, dict | list | int | float | str | bool | type(None)):
        return False
    try:
        json.dumps(value)  # also rejects cycles, so the walk below terminates
    except (TypeError, ValueError):
        return False
    return _json_round_trips(value)


def detect_content_type(value: object, *, for_display: bool = False) -> str:
    """The content type *value* is stored as; the first matching rule wins.

    Arrow-shaped values, then (displays only) the Markdown or PNG form Strata shows (see
    ``display_forms``), JSON that round-trips, modules, instances of classes that arrived as
    ``module/cell``, and pickle for the rest.
    """
    if arrow_codec.is_arrow_value(value):
        return ARROW
    if for_display:
        form = display_forms.shown_form(value)
        if form is not None:
            return form[0]
    return _stored_type(value)


def _stored_type(value: object) -> str:
    if _is_json_value(value):
        return JSON
    if isinstance(value, types.ModuleType):
        return MODULE_IMPORT
    if objects.is_cell_instance(value):
        return CELL_INSTANCE
    return PICKLE


# --- Writers ------------------------------------------------------------------------


def serialize(name: str, value: object, out_dir: str, *, for_display: bool = False) -> Metadata:
    """Write *value* to ``out_dir/<file_stem(name)><ext>`` and return its metadata.

    Display pseudo-names (``__display__<i>``, ``_``) are treated as displays even without
    *for_display*. A value that cannot be written yields ``{"error", "type"}`` and no file.
    """
    folder = Path(out_dir)
    stem = folder / file_stem(name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if arrow_codec.is_arrow_value(value):
            return _write_arrow(value, stem)
        if for_display or _is_display_name(name):
            form = display_forms.shown_form(value)  # rendered once, written as it is
            if form is not None:
                return (
                    _write_markdown(form[1], stem)
                    if form[0] == MARKDOWN
                    else _write_png(form[1], stem)
                )
        return _WRITERS[_stored_type(value)](value, stem)
    except Exception as error:
        return {"error": str(error), "type": type(value).__name__}


def _write_arrow(value: object, stem: Path) -> Metadata:
    path = target(stem, ARROW)
    try:
        return arrow_codec.write(value, path)
    except Exception as error:
        if arrow_codec.is_pandas(value) and arrow_codec.wants_json_table(error):
            return arrow_codec.write_json_table(value, path)
        return objects.write_pickle(value, stem)


def _write_json(value: object, stem: Path) -> Metadata:
    path = target(stem, JSON)
    with removed_on_error(path), open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2)
    return written(JSON, path, preview=value)


def _write_markdown(text: str, stem: Path) -> Metadata:
    path = target(stem, MARKDOWN)
    with removed_on_error(path):
        path.write_text(text, encoding="utf-8")
    return written(MARKDOWN, path, markdown_text=text, preview=None)


def _write_png(rendered: display_forms.Png, stem: Path) -> Metadata:
    png, width, height = rendered
    if width is None or height is None:
        width, height = _png_size(png)
    path = target(stem, PNG)
    with removed_on_error(path), open(path, "wb") as f:
        f.write(png)
    data_url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return written(PNG, path, inline_data_url=data_url, width=width, height=height, preview=None)


def _png_size(png: bytes) -> tuple[int | None, int | None]:
    """Ask PIL for the image size; ``(None, None)`` without PIL or for bad bytes."""
    try:
        from PIL import Image

        with Image.open(io.BytesIO(png)) as image:
            return image.size[0], image.size[1]
    except Exception:
        return None, None


_WRITERS: dict[str, Callable[[Any, Path], Metadata]] = {
    ARROW: _write_arrow,
    JSON: _write_json,
    MODULE_IMPORT: objects.write_module,
    CELL_INSTANCE: objects.write_cell_instance,
    PICKLE: objects.write_pickle,
}


# --- Readers ------------------------------------------------------------------------


def load_input(
    path: str,
    content_type: str,
    *,
    injected: dict[str, object] | None = None,
    work_dir: str | None = None,
    limits: Mapping[str, int] | None = None,
) -> object:
    """The value a cell sees for the staged input file *path* of *content_type*.

    A relative *path* is taken relative to *work_dir* when given. *injected* holds the
    already-loaded values a ``module/cell`` descriptor's source may refer to. *limits* are
    the worker's caps on what a folder input unpacks to (``folder_input_bytes``,
    ``folder_input_entries``; see ``archives``). Raises on any failure
    (``UnknownContentTypeError``, ``RArtifactError``, ``PrecisionError``, an
    ``ArchiveError`` or whatever the format's reader raised).
    """
    file_path = Path(path)
    if work_dir is not None and not file_path.is_absolute():
        file_path = Path(work_dir) / file_path
    if content_type == MODULE_CELL:
        return objects.load_cell_module(file_path, injected)
    if content_type == DIR_TAR:
        caps = limits or {}
        return archives.unpack(
            file_path, caps.get("folder_input_bytes"), caps.get("folder_input_entries")
        )
    reader = _READERS.get(content_type)
    if reader is None:
        raise UnknownContentTypeError(f"Unknown content type: {content_type!r}")
    return reader(file_path)


def _load_json(path: Path) -> object:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _load_r_object(path: Path) -> object:
    raise RArtifactError(path)


_READERS: dict[str, Callable[[Path], object]] = {
    ARROW: arrow_read.read,
    JSON: _load_json,
    PICKLE: objects.load_pickle,
    MARKDOWN: lambda path: path.read_text(encoding="utf-8"),
    MODULE_IMPORT: objects.load_module,
    CELL_INSTANCE: objects.load_cell_instance,
    FILE_PATH: lambda path: path,
    DIR_TAR: archives.unpack,
    DIR_MANIFEST: lambda path: path.with_name(path.name.removesuffix(".dirmanifest.json") + ".dir"),
    R_OBJECT: _load_r_object,
}
