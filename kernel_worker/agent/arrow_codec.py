"""The ``arrow/ipc`` content type: values to one Arrow IPC *stream* file (``arrow_read``
rebuilds them).

Shipped into kernels together with ``codecs.py`` (which imports it relatively), so the
module level imports the standard library only; pyarrow, numpy, pandas, polars and torch
are imported inside the functions that need them.

A value becomes a single Arrow table whose schema metadata says how to rebuild it:

- ``strata.arrow.shape``: ``table`` (the default when absent), ``tensor`` or ``scalar``;
- ``strata.arrow.source``: the library the value came from (``pandas.DataFrame``,
  ``torch.Tensor``, ...), so the reader can hand back the same kind of object;
- ``strata.arrow.pandas.name`` (JSON), ``strata.arrow.tensor.shape`` (JSON list),
  ``strata.arrow.tensor.dtype`` and ``strata.arrow.scalar.type`` (``uuid``/``complex``).

Tensors are one ``values`` column holding the flattened C-ordered array (complex as an
interleaved real view); scalars are one row in a ``value`` column. pandas values that
Arrow rejects are written instead as a tagged JSON document under the same name.
"""

from __future__ import annotations

import datetime
import decimal
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

# Objects of libraries that are imported lazily; they cannot be named at module level.
Table = Any
Value = Any

CONTENT_TYPE = "arrow/ipc"
PREVIEW_ROWS = 20

KEY_SHAPE = b"strata.arrow.shape"
KEY_SOURCE = b"strata.arrow.source"
KEY_SERIES_NAME = b"strata.arrow.pandas.name"
KEY_TENSOR_SHAPE = b"strata.arrow.tensor.shape"
KEY_TENSOR_DTYPE = b"strata.arrow.tensor.dtype"
KEY_SCALAR_TYPE = b"strata.arrow.scalar.type"

SHAPE_TABLE = b"table"
SHAPE_TENSOR = b"tensor"
SHAPE_SCALAR = b"scalar"

FROM_ARROW_TABLE = b"pyarrow.Table"
FROM_RECORD_BATCH = b"pyarrow.RecordBatch"
FROM_PANDAS_FRAME = b"pandas.DataFrame"
FROM_PANDAS_SERIES = b"pandas.Series"
FROM_POLARS_FRAME = b"polars.DataFrame"
FROM_POLARS_SERIES = b"polars.Series"
FROM_TORCH = b"torch.Tensor"
FROM_JAX = b"jax.Array"
FROM_CAPSULE = b"arrow.capsule"

SCALAR_UUID = b"uuid"
SCALAR_COMPLEX = b"complex"

# Arrow has no complex type: these travel as pairs of reals of the listed width.
COMPLEX_AS_REAL = {"complex64": "float32", "complex128": "float64"}

JSON_TABLE_FLAG = "__strata_arrow_json_fallback__"
JSON_TABLE_FORMAT = "strata.notebook.arrow_json_fallback.v1"


# --- JSON-safe previews -------------------------------------------------------------


def jsonable(value: object, *, keep_none: bool = False) -> object:
    """Reduce *value* to bool/int/float/str/list/dict for previews and JSON tables.

    ``None`` becomes ``""`` unless *keep_none*; numpy scalars become Python numbers;
    tuples become lists; dict keys become strings; anything else becomes ``str()``.
    """
    if value is None:
        return None if keep_none else ""
    if isinstance(value, bool | int | float | str):
        return value
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, np.floating):
            return float(value)
        if isinstance(value, np.bool_):
            return bool(value)
    if isinstance(value, list | tuple):
        return [jsonable(item, keep_none=keep_none) for item in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v, keep_none=keep_none) for k, v in value.items()}
    return str(value)


@contextmanager
def removed_on_error(path: Path) -> Iterator[None]:
    """Delete *path* if the block writing it fails, so no half file is left behind."""
    try:
        yield
    except BaseException:
        path.unlink(missing_ok=True)
        raise


# --- Recognising Arrow-shaped values ------------------------------------------------
# A value of a library's type means that library is already imported, so the probes
# look in sys.modules instead of importing anything.


def instance_of(module_name: str, *attrs: str) -> Callable[[object], bool]:
    """A probe for instances of ``module_name.<attr>``; False while that module is absent."""

    def probe(value: object) -> bool:
        module = sys.modules.get(module_name)
        kinds: tuple[Any, ...] = ()
        if module is not None:
            kinds = tuple(getattr(module, a, None) for a in attrs)
        return bool(kinds) and all(isinstance(k, type) for k in kinds) and isinstance(value, kinds)

    return probe


_TYPED_SCALARS = (
    datetime.datetime,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    decimal.Decimal,
    bytes,
    bytearray,
    uuid.UUID,
    complex,
)


def _is_typed_scalar(value: object) -> bool:
    return isinstance(value, _TYPED_SCALARS)


def _exports_arrow_stream(value: object) -> bool:
    # Probed on the type (an instance __getattr__ may misbehave); iterators are left
    # alone because reading a one-shot stream would consume it.
    kind = type(value)
    return hasattr(kind, "__arrow_c_stream__") and not hasattr(kind, "__next__")


def _exports_dlpack(value: object) -> bool:
    return hasattr(type(value), "__dlpack__")


def is_pandas(value: object) -> bool:
    return instance_of("pandas", "DataFrame", "Series")(value)


# --- Building the table -------------------------------------------------------------


def _tagged(table: Table, tags: dict[bytes, bytes]) -> Table:
    return table.replace_schema_metadata({**(table.schema.metadata or {}), **tags})


def _table_tags(source: bytes) -> dict[bytes, bytes]:
    return {KEY_SHAPE: SHAPE_TABLE, KEY_SOURCE: source}


def _from_pyarrow(value: Value) -> Table:
    import pyarrow as pa

    if isinstance(value, pa.RecordBatch):
        return _tagged(pa.Table.from_batches([value]), _table_tags(FROM_RECORD_BATCH))
    return _tagged(value, _table_tags(FROM_ARROW_TABLE))


def _series_name_tag(name: object) -> bytes:
    plain = name is None or isinstance(name, str | int | float | bool)
    return json.dumps(name if plain else str(name)).encode("utf-8")


def _from_pandas(value: Value) -> Table:
    import pandas as pd
    import pyarrow as pa

    if isinstance(value, pd.DataFrame):
        return _tagged(pa.Table.from_pandas(value), _table_tags(FROM_PANDAS_FRAME))
    tags = _table_tags(FROM_PANDAS_SERIES)
    tags[KEY_SERIES_NAME] = _series_name_tag(value.name)
    return _tagged(pa.Table.from_pandas(value.to_frame()), tags)


def _from_polars(value: Value) -> Table:
    polars = sys.modules["polars"]
    if isinstance(value, polars.DataFrame):
        return _tagged(value.to_arrow(), _table_tags(FROM_POLARS_FRAME))
    return _tagged(value.to_frame().to_arrow(), _table_tags(FROM_POLARS_SERIES))


def _from_numpy(value: Value) -> Table:
    np = sys.modules["numpy"]
    if isinstance(value, np.ndarray):
        return tensor_table(value)
    return _scalar_table(value.item())


def _from_torch(value: Value) -> Table:
    return tensor_table(value.detach().cpu().numpy(), source=FROM_TORCH)


def _from_jax(value: Value) -> Table:
    import numpy as np

    return tensor_table(np.asarray(value), source=FROM_JAX)


def _from_typed_scalar(value: Value) -> Table:
    import pyarrow as pa

    if isinstance(value, uuid.UUID):
        column = pa.array([value.bytes], type=pa.binary(16))
        scalar_type = SCALAR_UUID
    elif isinstance(value, complex):
        pair = pa.struct([("real", pa.float64()), ("imag", pa.float64())])
        column = pa.array([{"real": value.real, "imag": value.imag}], type=pair)
        scalar_type = SCALAR_COMPLEX
    else:
        return _scalar_table(value)
    tags = {KEY_SHAPE: SHAPE_SCALAR, KEY_SCALAR_TYPE: scalar_type}
    return _tagged(pa.table({"value": column}), tags)


def _from_capsule(value: Value) -> Table:
    import pyarrow as pa

    return _tagged(pa.table(value), _table_tags(FROM_CAPSULE))


def _from_dlpack(value: Value) -> Table:
    import numpy as np

    return tensor_table(np.from_dlpack(value))


def _scalar_table(value: object) -> Table:
    import pyarrow as pa

    return _tagged(pa.table({"value": pa.array([value])}), {KEY_SHAPE: SHAPE_SCALAR})


def tensor_table(array: Value, source: bytes | None = None) -> Table:
    """One ``values`` column over the flattened array (no copy when already C-ordered)."""
    import numpy as np
    import pyarrow as pa

    dense = np.ascontiguousarray(array)
    flat = dense.reshape(-1)
    real = COMPLEX_AS_REAL.get(str(flat.dtype))
    if real is not None:
        flat = flat.view(real)
    tags = {
        KEY_SHAPE: SHAPE_TENSOR,
        KEY_TENSOR_SHAPE: json.dumps(list(dense.shape)).encode("utf-8"),
        KEY_TENSOR_DTYPE: str(dense.dtype).encode("utf-8"),
    }
    if source is not None:
        tags[KEY_SOURCE] = source
    return _tagged(pa.table({"values": pa.array(flat)}), tags)


class _Rule(NamedTuple):
    matches: Callable[[object], bool]
    to_table: Callable[[Value], Table]


# Rules that know the value's library come first, so its type can be rebuilt on read;
# the two protocol probes last, since most of the libraries above also speak them.
_NAMED_RULES = (
    _Rule(instance_of("pyarrow", "Table", "RecordBatch"), _from_pyarrow),
    _Rule(is_pandas, _from_pandas),
    _Rule(instance_of("polars", "DataFrame", "Series"), _from_polars),
    _Rule(instance_of("numpy", "ndarray", "generic"), _from_numpy),
    _Rule(instance_of("torch", "Tensor"), _from_torch),
    _Rule(instance_of("jax", "Array"), _from_jax),
    _Rule(_is_typed_scalar, _from_typed_scalar),
)
_PROTOCOL_RULES = (
    _Rule(_exports_arrow_stream, _from_capsule),
    _Rule(_exports_dlpack, _from_dlpack),
)


def _rule_for(value: object) -> _Rule | None:
    return next((r for r in (*_NAMED_RULES, *_PROTOCOL_RULES) if r.matches(value)), None)


def is_arrow_value(value: object) -> bool:
    """Whether *value* is stored as ``arrow/ipc`` (first step of type detection)."""
    return _rule_for(value) is not None


def matched_by_library(value: object) -> bool:
    """Whether a library rule (not just a protocol probe) claims *value*."""
    return any(rule.matches(value) for rule in _NAMED_RULES)


def to_table(value: object) -> Table:
    """The tagged Arrow table *value* is stored as."""
    rule = _rule_for(value)
    if rule is None:
        raise ValueError(f"Cannot convert {type(value).__name__} to Arrow")
    return rule.to_table(value)


def wants_json_table(error: Exception) -> bool:
    """Whether a failed pandas conversion should be stored as the JSON table instead."""
    if isinstance(error, ImportError | ValueError | AttributeError):
        return True
    pa = sys.modules.get("pyarrow")
    return pa is not None and isinstance(error, pa.ArrowException)


# --- Writing ------------------------------------------------------------------------


def write(value: object, path: Path) -> dict[str, object]:
    """Write *value* as an IPC stream at *path*; return its output metadata."""
    import pyarrow as pa

    table = to_table(value)
    with removed_on_error(path):
        reused = _take_spare(path, table)
        if reused is not None:
            with reused as raw:  # written over from its start, then cut to what was written
                with pa.ipc.new_stream(pa.PythonFile(raw, mode="w"), table.schema) as writer:
                    writer.write_table(table)
                raw.truncate(raw.tell())
        else:
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
                w.write_table(table)
    return describe(table, path.name, os.path.getsize(path))


# --- Writing over a kept file ---------------------------------------------------------
# The worker keeps large files of finished runs (kernel_worker.runs.reuse) and offers them in
# each run's plan: on a memory filesystem, writing over a file's pages costs about half of
# allocating new ones. The rename decides who gets a file the worker also reaches for.

SPARE_MIN_BYTES = 1 << 20
_spares: list[tuple[str, int]] = []
"""``(path, size)`` of the kept files offered to this run (see :func:`offer_spares`)."""


def offer_spares(spares: object) -> None:
    """The kept files this run may write its large Arrow outputs over (or none)."""
    _spares.clear()
    if isinstance(spares, list):
        _spares.extend((str(path), int(size)) for path, size in spares)


def _take_spare(path: Path, table: Table) -> Any:
    """A kept file renamed to *path* and opened to be written over, or None.

    Taken only for an output of at least ``SPARE_MIN_BYTES`` and from a file at most twice
    its size (cutting the rest would cost what reuse saves); the smallest one large enough,
    else the largest one smaller.
    """
    if not _spares or table.nbytes < SPARE_MIN_BYTES:
        return None
    import pyarrow as pa

    counter = pa.MockOutputStream()  # the stream's exact length, without writing it
    with pa.ipc.new_stream(counter, table.schema) as writer:
        writer.write_table(table)
    needed = counter.size()
    fitting = [spare for spare in _spares if spare[1] <= 2 * needed]
    if needed < SPARE_MIN_BYTES or not fitting:
        return None
    large_enough = [spare for spare in fitting if spare[1] >= needed]
    chosen = (min(large_enough, key=lambda spare: spare[1]) if large_enough
              else max(fitting, key=lambda spare: spare[1]))  # fmt: skip
    _spares.remove(chosen)
    if os.path.lexists(path):
        return None
    try:
        os.rename(chosen[0], path)
    except OSError:  # taken by the worker or released meanwhile
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # a new file's mode, as ``OSFile(path, "wb")`` gives
    except OSError:
        os.close(fd)
        return None
    return os.fdopen(fd, "wb", buffering=0)  # from an open descriptor: nothing is truncated


def _umask() -> int:
    """The process's umask, read without changing it (Linux); 0o022 when unknown."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def describe(table: Table, file_name: str, size: int) -> dict[str, object]:
    """Output metadata for a written table: the preview depends on its shape."""
    tags = table.schema.metadata or {}
    shape = tags.get(KEY_SHAPE, SHAPE_TABLE)
    head: dict[str, object] = {"content_type": CONTENT_TYPE, "file": file_name}
    if shape == SHAPE_TENSOR:
        dims = tuple(json.loads(tags.get(KEY_TENSOR_SHAPE, b"[]").decode("utf-8")))
        dtype = tags.get(KEY_TENSOR_DTYPE, b"").decode("utf-8")
        return {**head, "bytes": size, "preview": f"ndarray shape={dims} dtype={dtype}"}
    if shape == SHAPE_SCALAR:
        return {**head, "bytes": size, "preview": jsonable(scalar_of(table))}
    shown = min(PREVIEW_ROWS, table.num_rows)
    columns = [column.to_pylist() for column in table.slice(0, shown).columns]
    rows = [[jsonable(column[i]) for column in columns] for i in range(shown)]
    return {
        **head,
        "rows": table.num_rows,
        "columns": table.column_names,
        "bytes": size,
        "preview": rows,
    }


def scalar_of(table: Table) -> object:
    """The single value of a scalar-shaped table."""
    scalar_type = (table.schema.metadata or {}).get(KEY_SCALAR_TYPE, b"")
    raw = table.column(0)[0].as_py()
    if scalar_type == SCALAR_UUID:
        return uuid.UUID(bytes=raw)
    if scalar_type == SCALAR_COMPLEX:
        return complex(raw["real"], raw["imag"])
    return raw


def write_json_table(value: Value, path: Path) -> dict[str, object]:
    """Store a pandas value Arrow rejected as the tagged JSON table document.

    A value this cannot read either (a cell whose ``__str__`` raises) raises: the variable
    is reported as an error, never stored as an empty table.
    """
    import pandas as pd

    is_series = isinstance(value, pd.Series)
    frame = value.to_frame() if is_series else value
    columns = [jsonable(c) for c in frame.columns]
    rows = [[jsonable(x) for x in r] for r in frame.itertuples(index=False, name=None)]
    document: dict[str, object] = {
        JSON_TABLE_FLAG: True,
        "format": JSON_TABLE_FORMAT,
        "kind": "series" if is_series else "dataframe",
        "columns": columns,
        "data": rows,
        "series_name": jsonable(value.name) if is_series else None,
    }
    with removed_on_error(path), open(path, "w", encoding="utf-8") as f:
        json.dump(document, f)
    return {
        "content_type": CONTENT_TYPE,
        "file": path.name,
        "rows": len(rows),
        "columns": columns,
        "bytes": os.path.getsize(path),
        "preview": rows[:PREVIEW_ROWS],
    }
