"""The ``arrow/ipc`` content type read back: one Arrow IPC stream file (or the JSON table
document ``arrow_codec`` writes for pandas values Arrow rejects) to the value it came from.

The schema tags ``arrow_codec`` writes pick the kind of object rebuilt. A jax array comes
back at its stored width, turning ``jax_enable_x64`` on if it must (``PrecisionError`` where
even that narrows it). Stdlib only at import time, like ``arrow_codec``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .arrow_codec import (
    COMPLEX_AS_REAL,
    FROM_ARROW_TABLE,
    FROM_CAPSULE,
    FROM_JAX,
    FROM_PANDAS_SERIES,
    FROM_POLARS_FRAME,
    FROM_POLARS_SERIES,
    FROM_RECORD_BATCH,
    FROM_TORCH,
    JSON_TABLE_FLAG,
    JSON_TABLE_FORMAT,
    KEY_SERIES_NAME,
    KEY_SHAPE,
    KEY_SOURCE,
    KEY_TENSOR_DTYPE,
    KEY_TENSOR_SHAPE,
    SHAPE_SCALAR,
    SHAPE_TABLE,
    SHAPE_TENSOR,
    Table,
    Value,
    scalar_of,
)

# Appended by the caller to a cell's stderr when reading a jax input had to turn
# jax_enable_x64 on. The wording is what the reference client's users see.
X64_NOTE = (
    "strata: turned on jax_enable_x64 to hand back a stored 64-bit array at its own "
    "width. That switch is process-wide, so in a reused worker every later cell gets "
    "64-bit defaults too, and no cell's provenance records which it got. Put "
    "`# @env JAX_ENABLE_X64=1` on the cells that want it: jax reads it at import, and "
    "it becomes part of their env hash.\n"
)

# jax's x64 switch is process state, so whether *we* flipped it is too.
_x64_flipped: list[bool] = []


class PrecisionError(RuntimeError):
    """A stored array cannot be rebuilt as a jax array without losing width."""

    code = "PRECISION_NARROWED"

    def __init__(self, stored: str, rebuilt: str, *, variable_name: str | None = None) -> None:
        self.stored_dtype = stored
        self.reconstructed_dtype = rebuilt
        self.variable_name = variable_name
        what = f"variable '{variable_name}'" if variable_name else "a stored array"
        super().__init__(
            f"Reading {what} as a JAX array narrows {stored} to {rebuilt}, even with "
            f"jax_enable_x64 on, so the value the upstream cell stored cannot be handed "
            f"over unchanged. This JAX build appears unable to represent {stored}."
        )


def x64_was_enabled_here() -> bool:
    """Whether rebuilding a jax input in this process turned ``jax_enable_x64`` on."""
    return bool(_x64_flipped)


def read(path: Path) -> object:
    """Rebuild the value stored at *path* (an IPC stream or the JSON table document)."""
    document = _json_table_document(path)
    if document is not None:
        return _from_json_table(document)

    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        # Buffers stay valid after the map object closes; one-chunk columns are not copied.
        table = pa.ipc.open_stream(source).read_all().combine_chunks()
    shape = (table.schema.metadata or {}).get(KEY_SHAPE, SHAPE_TABLE)
    if shape == SHAPE_TENSOR:
        return _tensor_of(table)
    if shape == SHAPE_SCALAR:
        return scalar_of(table)
    return _tabular_of(table)


def _json_table_document(path: Path) -> dict[str, object] | None:
    """The JSON table document at *path*, or None (an IPC stream never starts with '{')."""
    try:
        with open(path, "rb") as f:
            if not f.read(64).lstrip().startswith(b"{"):
                return None
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(document, dict) or document.get(JSON_TABLE_FLAG) is not True:
        return None
    return document if document.get("format") == JSON_TABLE_FORMAT else None


def _from_json_table(document: dict[str, object]) -> object:
    columns, rows = document.get("columns"), document.get("data")
    if not isinstance(columns, list) or not isinstance(rows, list):
        raise ValueError("Malformed JSON table document: 'columns' and 'data' must be lists")
    try:
        import pandas as pd
    except ImportError:
        return document
    frame = pd.DataFrame(rows, columns=columns)
    if document.get("kind") != "series":
        return frame
    series = frame.iloc[:, 0] if frame.shape[1] else pd.Series(dtype=object)
    series.name = document.get("series_name")
    return series


def _series_name_of(raw: bytes) -> object:
    text = raw.decode("utf-8")
    try:
        return json.loads(text)
    except ValueError:  # an older, plain-text name
        return text or None


def _tabular_of(table: Table) -> object:
    source = (table.schema.metadata or {}).get(KEY_SOURCE, b"")
    if source in (FROM_ARROW_TABLE, FROM_CAPSULE):
        return table
    if source == FROM_RECORD_BATCH:
        import pyarrow as pa

        batches = table.to_batches()
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)
    if source in (FROM_POLARS_FRAME, FROM_POLARS_SERIES):
        rebuilt = _polars_of(table, source)
        if rebuilt is not None:
            return rebuilt
    try:
        frame = table.to_pandas()
    except Exception:
        return table
    if source != FROM_PANDAS_SERIES:
        return frame
    try:
        series = frame.iloc[:, 0]
        series.name = _series_name_of(table.schema.metadata.get(KEY_SERIES_NAME, b""))
    except Exception:
        return frame
    return series


def _polars_of(table: Table, source: bytes) -> object | None:
    try:
        import polars as pl
    except ImportError:
        return None
    frame = pl.from_arrow(table)
    if source == FROM_POLARS_SERIES and isinstance(frame, pl.DataFrame):
        return frame.to_series(0)
    return frame


def _tensor_of(table: Table) -> object:
    import numpy as np

    tags = table.schema.metadata or {}
    dims = tuple(json.loads(tags.get(KEY_TENSOR_SHAPE, b"[]").decode("utf-8")))
    dtype_name = tags.get(KEY_TENSOR_DTYPE, b"").decode("utf-8")
    flat = table.column(0).to_numpy(zero_copy_only=False)
    if dtype_name:
        dtype = np.dtype(dtype_name)
        real = COMPLEX_AS_REAL.get(str(dtype))
        flat = flat.astype(real, copy=False).view(dtype) if real else flat.astype(dtype, copy=False)
    array = np.ascontiguousarray(flat).reshape(dims)
    source = tags.get(KEY_SOURCE, b"")
    if source == FROM_TORCH:
        try:
            import torch
        except ImportError:
            return array
        return torch.from_numpy(array)
    if source == FROM_JAX:
        return _as_jax(array)
    return array


def _as_jax(array: Value) -> object:
    """A jax array of *array*'s own dtype, turning x64 on when that is what it takes."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return array
    rebuilt = jnp.asarray(array)
    if rebuilt.dtype != array.dtype:
        jax.config.update("jax_enable_x64", True)
        _x64_flipped.append(True)
        rebuilt = jnp.asarray(array)
    if rebuilt.dtype != array.dtype:
        raise PrecisionError(str(array.dtype), str(rebuilt.dtype))
    return rebuilt
