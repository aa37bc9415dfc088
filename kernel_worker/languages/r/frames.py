"""Data frames between R and Arrow, converted on the worker's side (R needs no ``arrow``).

An R kernel reads and writes a data frame as a *frame folder*: ``frame.json`` (format
:data:`FRAME_FORMAT`: the row count and, per column, its name and type) and one binary file
per numeric column, ``<i>.bin``, holding the column as R keeps it in memory, little-endian:

=========== =============================== ============================================
type        file / values                   Arrow type (R to Arrow; Arrow to R)
=========== =============================== ============================================
double      float64; NA is R's NA bits      float64 (NA: null, NaN stays NaN); from any
                                            float, and integers beyond R's int range
integer     int32; NA is -2^31              int32; from int8-32, uint8-16, and int64 or
                                            uint32-64 whose values all fit
logical     int32 (0, 1); NA is -2^31       bool
date        float64 days since 1970-01-01   date32
datetime    float64 seconds since the epoch timestamp[us] with the column's time zone
            and ``tz`` (``""``: none)       (none: naive); from any timestamp
string      ``values``: strings and nulls   string; factors are written as strings
factor      ``values`` and ``levels``       from a dictionary column (Arrow to R only)
=========== =============================== ============================================

Any other column is written as strings (R: ``format`` of each value; Arrow: its text).
pandas index columns (``__index_level_0__``) are not passed to R.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["FRAME_FORMAT", "frame_to_arrow", "table_to_frame"]

FRAME_FORMAT = "skw.r-frame.v1"
FRAME_FILE = "frame.json"
_Reader = Callable[[str], bytes]
"""Gives a frame folder's file by name."""
_NA_INT = -(2**31)
_NA_REAL_BITS = 0x7FF00000000007A2  # R's NA_real_: a NaN whose low word is 1954
_INT32_RANGE = (_NA_INT + 1, 2**31 - 1)
_MICROS = 1_000_000


# -- Arrow to R ---------------------------------------------------------------------------------


def table_to_frame(table: pa.Table, folder: Path) -> None:
    """Write ``table`` as a frame folder R reads (blocking: file work)."""
    folder.mkdir()
    columns: list[dict[str, Any]] = []
    for index, (name, column) in enumerate(zip(table.column_names, table.columns, strict=True)):
        if name.startswith("__index_level_") and name.endswith("__"):
            continue
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        entry = _r_column(array, folder, index)
        columns.append({"name": name, **entry})
    meta = {"format": FRAME_FORMAT, "nrow": table.num_rows, "columns": columns}
    (folder / FRAME_FILE).write_text(json.dumps(meta), encoding="utf-8")


def _r_column(array: pa.Array, folder: Path, index: int) -> dict[str, Any]:
    kind = array.type
    if pa.types.is_dictionary(kind):
        levels = [str(v) for v in array.dictionary.to_pylist()]
        return {"type": "factor", "values": _texts(array.cast(pa.string())), "levels": levels}
    if pa.types.is_boolean(kind) or pa.types.is_null(kind):
        values = array.cast(pa.int32()) if pa.types.is_boolean(kind) else _all_null(array)
        return {"type": "logical", "file": _write_ints(values, folder, index)}
    if pa.types.is_integer(kind):
        if _fits_int32(array):
            return {"type": "integer", "file": _write_ints(array.cast(pa.int32()), folder, index)}
        return {"type": "double", "file": _write_doubles(array.cast(pa.float64()), folder, index)}
    if pa.types.is_floating(kind):
        return {"type": "double", "file": _write_doubles(array.cast(pa.float64()), folder, index)}
    if pa.types.is_date(kind):
        days = array.cast(pa.date32()).cast(pa.int32()).cast(pa.float64())
        return {"type": "date", "file": _write_doubles(days, folder, index)}
    if pa.types.is_timestamp(kind):
        micros = array.cast(pa.timestamp("us", kind.tz)).cast(pa.int64())
        seconds = pc.divide(micros.cast(pa.float64()), float(_MICROS))
        tz = kind.tz or "UTC"
        return {"type": "datetime", "file": _write_doubles(seconds, folder, index), "tz": tz}
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return {"type": "string", "values": array.to_pylist()}
    return {"type": "string", "values": _texts(array)}


def _texts(array: pa.Array) -> list[str | None]:
    try:
        return list(array.cast(pa.string()).to_pylist())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return [None if v is None else str(v) for v in array.to_pylist()]


def _all_null(array: pa.Array) -> pa.Array:
    return pa.nulls(len(array), pa.int32())


def _fits_int32(array: pa.Array) -> bool:
    bounds = pc.min_max(array).as_py()
    low, high = bounds["min"], bounds["max"]
    return low is None or (_INT32_RANGE[0] <= low and high <= _INT32_RANGE[1])


def _write_ints(array: pa.Array, folder: Path, index: int) -> str:
    filled = pc.fill_null(array, pa.scalar(_NA_INT, pa.int32()))
    return _write_buffer(filled, 4, folder, index)


def _write_doubles(array: pa.Array, folder: Path, index: int) -> str:
    if array.null_count:
        bits = _bits(pc.fill_null(array, 0.0))
        array = pc.if_else(pc.is_null(array), pa.scalar(_NA_REAL_BITS, pa.uint64()), bits)
    return _write_buffer(array, 8, folder, index)


def _bits(array: pa.Array) -> pa.Array:
    """A float64 array's values as their uint64 bit patterns."""
    return pa.Array.from_buffers(pa.uint64(), len(array), [None, array.buffers()[1]], 0, 0,
                                 array.offset)  # fmt: skip


def _write_buffer(array: pa.Array, width: int, folder: Path, index: int) -> str:
    name = f"{index}.bin"
    data = array.buffers()[1]
    start = array.offset * width
    with open(folder / name, "wb") as fh:
        if data is not None:
            fh.write(memoryview(data)[start : start + len(array) * width])
    return name


# -- R to Arrow ---------------------------------------------------------------------------------


def frame_to_arrow(meta: Mapping[str, Any], read: _Reader, out: BinaryIO) -> None:
    """Write the frame R described (``meta``, its ``frame.json``) as one Arrow IPC stream
    to ``out``; ``read(name)`` gives a column file's bytes. No schema metadata: Python
    cells read it as a pandas DataFrame, as they read a table of the reference's R cells."""
    if meta.get("format") != FRAME_FORMAT:
        raise ValueError("not a frame this worker's R side wrote")
    rows = int(meta["nrow"])
    names: list[str] = []
    arrays: list[pa.Array] = []
    for column in meta["columns"]:
        names.append(str(column["name"]))
        arrays.append(_arrow_column(column, rows, read))
    table = pa.Table.from_arrays(arrays, names=names) if arrays else _empty(rows)
    with pa.ipc.new_stream(out, table.schema) as writer:
        writer.write_table(table)


def _empty(rows: int) -> pa.Table:
    return pa.table({}).append_column("_", pa.nulls(rows)).drop_columns(["_"])


def _arrow_column(column: Mapping[str, Any], rows: int, read: _Reader) -> pa.Array:
    kind = column["type"]
    if kind in ("string", "factor"):
        return pa.array(column["values"], pa.string())
    data = read(str(column["file"]))
    if kind in ("integer", "logical"):
        ints = _from_bytes(pa.int32(), data, rows, 4)
        valid = pc.not_equal(ints, pa.scalar(_NA_INT, pa.int32()))
        values = pc.not_equal(ints, 0) if kind == "logical" else ints
        return pc.if_else(valid, values, pa.scalar(None, values.type))
    doubles = _from_bytes(pa.float64(), data, rows, 8)
    bits = _from_bytes(pa.uint64(), data, rows, 8)
    low = pc.bit_wise_and(bits, pa.scalar(0xFFFFFFFF, pa.uint64()))
    na = pc.and_(pc.is_nan(doubles), pc.equal(low, pa.scalar(1954, pa.uint64())))
    values = pc.if_else(na, pa.scalar(None, pa.float64()), doubles)
    if kind == "date":
        return pc.floor(values).cast(pa.int32()).cast(pa.date32())
    if kind == "datetime":
        micros = pc.round(pc.multiply(values, float(_MICROS))).cast(pa.int64())
        return micros.cast(pa.timestamp("us", str(column.get("tz") or "") or None))
    return values


def _from_bytes(kind: pa.DataType, data: bytes, rows: int, width: int) -> pa.Array:
    if len(data) != rows * width:
        raise ValueError(f"a column file holds {len(data)} bytes, not {rows * width}")
    return pa.Array.from_buffers(kind, rows, [None, pa.py_buffer(data)])
