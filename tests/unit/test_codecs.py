"""The in-kernel codecs, run in-process on plain data (no kernels).

Expected names, metadata and messages are the ones observed from strata-notebook 0.11;
``tests/interop/reference_codecs_check.py`` compares against the reference code itself.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import pickle
import re
import sys
import tarfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest
from matplotlib.figure import Figure
from PIL import Image

from kernel_worker.agent import codecs, mutations


def write_and_load(tmp_path: Path, name: str, value: object) -> tuple[dict[str, Any], object]:
    meta = codecs.serialize(name, value, str(tmp_path))
    assert "error" not in meta, meta
    return meta, codecs.load_input(str(tmp_path / str(meta["file"])), str(meta["content_type"]))


def stream_schema(path: Path) -> pa.Schema:
    with pa.ipc.open_stream(pa.memory_map(str(path))) as reader:
        return reader.schema


# --- names --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "stem"),
    [
        ("df", "df"),
        ("x_1", "x_1"),
        ("__display__0", "__display__0"),
        ("Big", "Big-f69fd263"),
        ("K", "K-86be9a55"),
        ("Data", "Data-cec3a9b8"),
        ("DF", "DF-4a3161bb"),
    ],
)
def test_file_stem_hashes_names_with_upper_case(name: str, stem: str) -> None:
    assert codecs.file_stem(name) == stem


@pytest.mark.parametrize(
    ("content_type", "ext"),
    [
        ("arrow/ipc", ".arrow"),
        ("json/object", ".json"),
        ("pickle/object", ".pickle"),
        ("module/import", ".module.json"),
        ("module/cell", ".cell_module.json"),
        ("module/cell-instance", ".cell_instance.pickle"),
        ("dir/tar", ".dir.tar"),
        ("text/markdown", ".md"),
        ("image/png", ".png"),
        ("file/path", ".bin"),
        ("application/x-r-rds", ".bin"),
    ],
)
def test_extension_for(content_type: str, ext: str) -> None:
    assert codecs.extension_for(content_type) == ext


def test_build_env_names_this_interpreter() -> None:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert re.fullmatch(rf"cpython-{re.escape(version)}-{sys.platform}-\w+", codecs.build_env())


# --- type detection -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "content_type"),
    [
        ({"a": [1, None]}, "json/object"),
        (float("nan"), "json/object"),
        (None, "json/object"),
        ((1, 2), "pickle/object"),
        ({1: "a"}, "pickle/object"),
        ({"a": (1, 2)}, "pickle/object"),
        ({1, 2}, "pickle/object"),
        (b"raw", "arrow/ipc"),
        (np.float32(1.5), "arrow/ipc"),
        (datetime.date(2020, 1, 1), "arrow/ipc"),
        (json, "module/import"),
    ],
)
def test_detect_content_type(value: object, content_type: str) -> None:
    assert codecs.detect_content_type(value) == content_type


def test_self_referencing_list_is_pickled_not_json() -> None:
    loop: list[object] = []
    loop.append(loop)
    assert codecs.detect_content_type(loop) == "pickle/object"


# --- json, pickle, module -------------------------------------------------------------


def test_json_output_metadata_file_and_round_trip(tmp_path: Path) -> None:
    value = {"a": [1, 2.5, None, True], "b": "é"}
    meta, loaded = write_and_load(tmp_path, "Data", value)
    text = (tmp_path / "Data-cec3a9b8.json").read_text(encoding="utf-8")
    assert text == json.dumps(value, indent=2)
    assert meta == {
        "content_type": "json/object",
        "file": "Data-cec3a9b8.json",
        "bytes": len(text.encode()),
        "preview": value,
    }
    assert loaded == value


def test_pickle_output_is_the_codec_envelope(tmp_path: Path) -> None:
    meta, loaded = write_and_load(tmp_path, "K", (1, "a"))
    assert meta == {
        "content_type": "pickle/object",
        "file": "K-86be9a55.pickle",
        "bytes": (tmp_path / "K-86be9a55.pickle").stat().st_size,
        "codec": "cloudpickle",
        "type": "tuple",
        "preview": "<tuple object>",
    }
    envelope = pickle.loads((tmp_path / "K-86be9a55.pickle").read_bytes())
    assert list(envelope) == ["__strata_object_codec__", "codec", "payload"]
    assert envelope["__strata_object_codec__"] == "strata.notebook.object_codec.v1"
    assert pickle.loads(envelope["payload"]) == (1, "a")
    assert loaded == (1, "a")


def test_functions_round_trip_through_cloudpickle(tmp_path: Path) -> None:
    offset = 3
    _, loaded = write_and_load(tmp_path, "f", lambda x: x + offset)
    assert callable(loaded) and loaded(4) == 7


def test_codec_env_var_selects_plain_pickle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRATA_NOTEBOOK_OBJECT_CODEC", " Pickle ")
    meta, loaded = write_and_load(tmp_path, "s", {3, 4})
    assert meta["codec"] == "pickle"
    assert pickle.loads((tmp_path / "s.pickle").read_bytes())["codec"] == "pickle"
    assert loaded == {3, 4}


def test_unknown_codec_is_an_error_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_NOTEBOOK_OBJECT_CODEC", "marshal")
    meta = codecs.serialize("s", {3}, str(tmp_path))
    assert meta["type"] == "set" and "marshal" in str(meta["error"])


def test_unpicklable_value_is_an_error_entry_without_file(tmp_path: Path) -> None:
    meta = codecs.serialize("lock", threading.Lock(), str(tmp_path))
    assert meta == {"error": "cannot pickle '_thread.lock' object", "type": "lock"}
    assert list(tmp_path.iterdir()) == []


def test_bare_legacy_pickle_is_loaded_as_is(tmp_path: Path) -> None:
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps(b"x" * 1000))
    assert codecs.load_input(str(path), "pickle/object") == b"x" * 1000


def test_module_output_and_import(tmp_path: Path) -> None:
    meta, loaded = write_and_load(tmp_path, "js", json)
    assert meta["preview"] == "<module 'json'>" and meta["file"] == "js.module.json"
    assert json.loads((tmp_path / "js.module.json").read_text()) == {"module_name": "json"}
    assert loaded is json


# --- arrow ------------------------------------------------------------------------------


def test_dataframe_metadata_preview_and_stream_format(tmp_path: Path) -> None:
    frame = pd.DataFrame({"a": range(30), "b": [None if i == 1 else f"s{i}" for i in range(30)]})
    meta, loaded = write_and_load(tmp_path, "DF", frame)
    assert list(meta) == ["content_type", "file", "rows", "columns", "bytes", "preview"]
    assert (meta["file"], meta["rows"], meta["columns"]) == ("DF-4a3161bb.arrow", 30, ["a", "b"])
    preview = meta["preview"]
    assert isinstance(preview, list) and len(preview) == 20
    assert preview[:2] == [[0, "s0"], [1, ""]]  # None shows as "" in previews
    tags = stream_schema(tmp_path / "DF-4a3161bb.arrow").metadata
    assert tags[b"strata.arrow.shape"] == b"table"
    assert tags[b"strata.arrow.source"] == b"pandas.DataFrame" and b"pandas" in tags
    with pytest.raises(pa.ArrowInvalid):
        pa.ipc.open_file(str(tmp_path / "DF-4a3161bb.arrow"))  # a stream, not the file format
    assert isinstance(loaded, pd.DataFrame) and loaded.equals(frame)


@pytest.mark.parametrize("name", ["price", 7, None])
def test_series_round_trip_keeps_its_name(tmp_path: Path, name: object) -> None:
    series = pd.Series([1.5, 2.5], name=name)
    _, loaded = write_and_load(tmp_path, "s", series)
    assert isinstance(loaded, pd.Series) and loaded.name == name
    assert loaded.tolist() == [1.5, 2.5]


def test_pyarrow_table_and_record_batch_keep_their_type(tmp_path: Path) -> None:
    table = pa.table({"a": [1, 2]})
    _, loaded_table = write_and_load(tmp_path, "t", table)
    _, loaded_batch = write_and_load(tmp_path, "b", pa.record_batch({"a": [1.5]}))
    assert isinstance(loaded_table, pa.Table) and loaded_table.column("a").to_pylist() == [1, 2]
    assert isinstance(loaded_batch, pa.RecordBatch) and loaded_batch.num_rows == 1


def test_plain_stream_without_metadata_becomes_a_dataframe(tmp_path: Path) -> None:
    table = pa.table({"a": [1, 2, 3]})
    path = tmp_path / "in.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    loaded = codecs.load_input(str(path), "arrow/ipc")
    assert isinstance(loaded, pd.DataFrame) and loaded["a"].tolist() == [1, 2, 3]


@pytest.mark.parametrize(
    "array",
    [
        np.arange(6).reshape(2, 3),
        np.array([1 + 2j, 3 - 4j]),
        np.arange(20, dtype=np.int16).reshape(4, 5)[:, ::2],
        np.zeros((0, 3), dtype=np.float32),
    ],
    ids=["matrix", "complex", "strided", "empty"],
)
def test_ndarray_round_trip(tmp_path: Path, array: np.ndarray) -> None:
    meta, loaded = write_and_load(tmp_path, "arr", array)
    assert meta["preview"] == f"ndarray shape={array.shape} dtype={array.dtype}"
    assert list(meta) == ["content_type", "file", "bytes", "preview"]
    assert isinstance(loaded, np.ndarray)
    assert loaded.dtype == array.dtype and loaded.shape == array.shape
    assert np.array_equal(loaded, array)


def test_zero_d_array_comes_back_with_one_axis(tmp_path: Path) -> None:
    # The reference stores np.ascontiguousarray(a), which is at least 1-d.
    meta, loaded = write_and_load(tmp_path, "arr", np.array(3.5))
    assert meta["preview"] == "ndarray shape=(1,) dtype=float64"
    assert isinstance(loaded, np.ndarray) and loaded.shape == (1,) and loaded[0] == 3.5


def test_arrow_input_is_memory_mapped_not_copied(tmp_path: Path) -> None:
    array = np.arange(2_000_000, dtype=np.float64)  # 16 MB
    meta = codecs.serialize("big", array, str(tmp_path))
    before = pa.total_allocated_bytes()
    loaded = codecs.load_input(str(tmp_path / str(meta["file"])), "arrow/ipc")
    assert pa.total_allocated_bytes() - before < 1_000_000
    assert isinstance(loaded, np.ndarray) and loaded[-1] == 1_999_999.0


@pytest.mark.parametrize(
    ("value", "preview"),
    [
        (datetime.datetime(2020, 1, 2, 3, 4, 5), "2020-01-02 03:04:05"),
        (datetime.timedelta(seconds=90), "0:01:30"),
        (decimal.Decimal("1.25"), "1.25"),
        (b"ab", "b'ab'"),
        (uuid.UUID(int=5), "00000000-0000-0000-0000-000000000005"),
        (3 + 4j, "(3+4j)"),
        (np.int64(7), 7),
    ],
)
def test_typed_scalars_round_trip(tmp_path: Path, value: object, preview: object) -> None:
    meta, loaded = write_and_load(tmp_path, "v", value)
    assert meta["content_type"] == "arrow/ipc" and meta["preview"] == preview
    assert stream_schema(tmp_path / "v.arrow").metadata[b"strata.arrow.shape"] == b"scalar"
    assert loaded == value


def test_dataframe_arrow_rejects_falls_back_to_json_table(tmp_path: Path) -> None:
    frame = pd.DataFrame({"a": [1, "x"]})
    meta, loaded = write_and_load(tmp_path, "mixed", frame)
    assert meta["file"] == "mixed.arrow" and meta["preview"] == [[1], ["x"]]
    document = json.loads((tmp_path / "mixed.arrow").read_text())
    assert document["__strata_arrow_json_fallback__"] is True
    assert document["format"] == "strata.notebook.arrow_json_fallback.v1"
    assert isinstance(loaded, pd.DataFrame) and loaded["a"].tolist() == [1, "x"]


class _StreamExporter:
    """A foreign table type that only speaks the Arrow PyCapsule stream protocol."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        return self._table.__arrow_c_stream__(requested_schema)


def test_arrow_stream_exporters_come_back_as_tables(tmp_path: Path) -> None:
    meta, loaded = write_and_load(tmp_path, "rel", _StreamExporter(pa.table({"x": [1]})))
    assert meta["columns"] == ["x"]
    assert isinstance(loaded, pa.Table) and loaded.column("x").to_pylist() == [1]


def test_unconvertible_exporter_is_pickled_and_leaves_no_arrow_file(tmp_path: Path) -> None:
    meta = codecs.serialize("ca", pa.chunked_array([[1, 2], [3]]), str(tmp_path))
    assert meta["content_type"] == "pickle/object" and meta["type"] == "ChunkedArray"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.pickle"]


# --- displays ---------------------------------------------------------------------------


class _Note:
    def _repr_markdown_(self) -> str:
        return "# Title"


def _png_bytes(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, "red").save(buffer, format="PNG")
    return buffer.getvalue()


class _Pixels:
    def _repr_png_(self) -> bytes:
        return _png_bytes((3, 2))


def test_markdown_display(tmp_path: Path) -> None:
    meta = codecs.serialize("__display__1", _Note(), str(tmp_path), for_display=True)
    assert meta == {
        "content_type": "text/markdown",
        "file": "__display__1.md",
        "bytes": 7,
        "markdown_text": "# Title",
        "preview": None,
    }
    assert codecs.load_input(str(tmp_path / "__display__1.md"), "text/markdown") == "# Title"


def test_display_checks_apply_to_displays_only(tmp_path: Path) -> None:
    assert codecs.serialize("note", _Note(), str(tmp_path))["content_type"] == "pickle/object"


@pytest.mark.parametrize(
    ("value", "size"),
    [(_Pixels(), (3, 2)), (Image.new("L", (4, 5)), (4, 5))],
    ids=["repr_png", "pil"],
)
def test_png_display(tmp_path: Path, value: object, size: tuple[int, int]) -> None:
    meta = codecs.serialize("__display__0", value, str(tmp_path), for_display=True)
    png = (tmp_path / "__display__0.png").read_bytes()
    assert meta["content_type"] == "image/png" and meta["preview"] is None
    assert (meta["width"], meta["height"]) == size
    assert meta["inline_data_url"] == "data:image/png;base64," + base64.b64encode(png).decode()
    assert list(meta) == [
        "content_type", "file", "bytes", "inline_data_url", "width", "height", "preview"
    ]  # fmt: skip


def test_matplotlib_figure_is_rendered_at_figsize_times_dpi(tmp_path: Path) -> None:
    figure = Figure(figsize=(2, 1.5), dpi=50)
    figure.add_subplot().plot([1, 3, 2])
    meta = codecs.serialize("__display__2", figure, str(tmp_path), for_display=True)
    assert (meta["width"], meta["height"]) == (100, 75)
    with Image.open(tmp_path / "__display__2.png") as image:
        assert image.size == (100, 75)


# --- cell modules and instances ------------------------------------------------------------

CELL_SOURCE = """
class Counter:
    def __init__(self, start):
        self.count = start + offset
def helper(x):
    return x * offset
class Slotted:
    __slots__ = ("a", "b")
class Stateful:
    def __init__(self):
        self.n, self.cache = 1, "expensive"
    def __getstate__(self):
        return {"n": self.n}
    def __setstate__(self, state):
        self.n, self.cache = state["n"], None
"""


@pytest.fixture
def cell_module(tmp_path: Path) -> Callable[[str, str], object]:
    created: list[str] = []

    def load(symbol: str, module_name: str = "nb_test_cells_abc") -> object:
        descriptor = {"module_name": module_name, "symbol_name": symbol, "source": CELL_SOURCE}
        path = tmp_path / f"{symbol}.cell_module.json"
        path.write_text(json.dumps(descriptor))
        created.append(module_name)
        return codecs.load_input(str(path), "module/cell", injected={"offset": 10})

    yield load
    for name in created:
        sys.modules.pop(name, None)


def test_cell_module_injects_caches_and_tags(cell_module: Callable[..., Any]) -> None:
    helper = cell_module("helper")
    counter_cls = cell_module("Counter")
    module = sys.modules["nb_test_cells_abc"]
    assert helper(2) == 20 and counter_cls.__module__ == "nb_test_cells_abc"
    assert module.__strata_cell_module__ is True
    assert module.__strata_cell_module_source__ == CELL_SOURCE
    assert counter_cls.__strata_cell_exported_class__ is True
    assert cell_module("helper") is helper  # the module is built once per process


def test_cell_module_with_failing_source_is_not_cached(tmp_path: Path) -> None:
    path = tmp_path / "bad.cell_module.json"
    source = "raise RuntimeError('boom')"
    path.write_text(json.dumps({"module_name": "nb_bad", "symbol_name": "x", "source": source}))
    with pytest.raises(RuntimeError, match="boom"):
        codecs.load_input(str(path), "module/cell")
    assert "nb_bad" not in sys.modules


def test_cell_instances_round_trip(tmp_path: Path, cell_module: Callable[..., Any]) -> None:
    counter = cell_module("Counter")(5)
    slotted = cell_module("Slotted")()
    slotted.a = [1]
    meta, loaded = write_and_load(tmp_path, "c", counter)
    assert meta["content_type"] == "module/cell-instance" and meta["type"] == "Counter"
    assert meta["file"] == "c.cell_instance.pickle" and meta["preview"] == "<Counter object>"
    assert type(loaded) is type(counter) and loaded.count == 15
    record = pickle.loads((tmp_path / "c.cell_instance.pickle").read_bytes())
    assert list(record) == ["module_name", "class_name", "source", "state_codec", "state_payload"]
    _, loaded_slotted = write_and_load(tmp_path, "sl", slotted)
    assert loaded_slotted.a == [1] and not hasattr(loaded_slotted, "b")


def test_cell_instance_state_hooks_are_used(
    tmp_path: Path, cell_module: Callable[..., Any]
) -> None:
    stateful = cell_module("Stateful")()
    stateful.n = 4
    _, loaded = write_and_load(tmp_path, "st", stateful)
    assert (loaded.n, loaded.cache) == (4, None)


def test_cell_instance_whose_module_is_gone_is_an_error(
    tmp_path: Path, cell_module: Callable[..., Any]
) -> None:
    counter = cell_module("Counter")(1)
    del sys.modules["nb_test_cells_abc"].__strata_cell_module_source__
    assert codecs.detect_content_type(counter) == "pickle/object"


# --- file, dir, markdown and refused inputs ------------------------------------------------


def test_file_path_markdown_and_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "__fetch_0_data.csv").write_text("a\n1\n")
    (tmp_path / "n.md").write_text("# hi")
    loaded = codecs.load_input("__fetch_0_data.csv", "file/path", work_dir=str(tmp_path))
    assert loaded == tmp_path / "__fetch_0_data.csv"
    assert codecs.load_input(str(tmp_path / "n.md"), "text/markdown") == "# hi"


def _tar(path: Path, *members: tarfile.TarInfo) -> Path:
    with tarfile.open(path, "w") as archive:
        for member in members:
            data = b"data" if member.isfile() else None
            if data is not None:
                member.size = len(data)
            archive.addfile(member, io.BytesIO(data) if data is not None else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def test_dir_tar_is_extracted_next_to_the_archive(tmp_path: Path) -> None:
    archive = _tar(
        tmp_path / "out.dir.tar",
        _member("a.txt"),
        _member("sub/b.txt"),
        _member("sub/l", tarfile.SYMTYPE, "b.txt"),
    )
    folder = codecs.load_input(str(archive), "dir/tar")
    assert folder == tmp_path / "out.dir"
    assert (tmp_path / "out.dir" / "sub" / "b.txt").read_bytes() == b"data"
    assert (tmp_path / "out.dir" / "sub" / "l").read_bytes() == b"data"


def test_an_absolute_member_lands_inside_the_folder(tmp_path: Path) -> None:
    """As tarfile's "data" filter (the reference's) has it: the leading "/" is dropped."""
    archive = _tar(tmp_path / "x.dir.tar", _member("/abs.txt"), _member("/sub/b.txt"))
    folder = codecs.load_input(str(archive), "dir/tar")
    assert (folder / "abs.txt").read_bytes() == b"data"
    assert (folder / "sub" / "b.txt").read_bytes() == b"data"
    assert not Path("/abs.txt").exists()


UNSAFE_MEMBERS = {
    "dotdot": _member("../evil.txt"),
    "nested-dotdot": _member("a/../../evil.txt"),
    "absolute-dotdot": _member("/../evil.txt"),
    "link-up": _member("l", tarfile.SYMTYPE, "../outside"),
    "nested-link-up": _member("d/l", tarfile.SYMTYPE, "../../outside"),
    "abs-link": _member("l", tarfile.SYMTYPE, "/etc/passwd"),
    "hardlink-up": _member("h", tarfile.LNKTYPE, "../outside"),
    "device": _member("dev", tarfile.CHRTYPE),
    "fifo": _member("fifo", tarfile.FIFOTYPE),
}


@pytest.mark.parametrize("member", UNSAFE_MEMBERS.values(), ids=UNSAFE_MEMBERS.keys())
def test_unsafe_tar_members_are_refused(tmp_path: Path, member: tarfile.TarInfo) -> None:
    archive = _tar(tmp_path / "x.dir.tar", _member("ok.txt"), member)
    with pytest.raises(codecs.UnsafeArchiveError, match="Refusing to unpack"):
        codecs.load_input(str(archive), "dir/tar")
    assert not (tmp_path / "x.dir" / "ok.txt").exists()
    assert not (tmp_path / "evil.txt").exists()


def test_r_only_input_raises_the_structured_error(tmp_path: Path) -> None:
    with pytest.raises(codecs.RArtifactError) as caught:
        codecs.load_input(str(tmp_path / "v.bin"), "application/x-r-rds")
    named = codecs.RArtifactError(caught.value.file_path, variable_name="v")
    assert str(named).startswith("Cannot consume R-only artifact (variable 'v') from Python:")
    assert named.code == "R_ONLY_ARTIFACT"


@pytest.mark.parametrize("content_type", ["image/png", "no/such", ""])
def test_unknown_content_types_raise(tmp_path: Path, content_type: str) -> None:
    with pytest.raises(codecs.UnknownContentTypeError, match="Unknown content type"):
        codecs.load_input(str(tmp_path / "x.bin"), content_type)


# --- mutation warnings ---------------------------------------------------------------------


def run_cell(
    inputs: dict[str, Any], cell: Callable[[dict[str, Any]], None], exported: set[str]
) -> list[dict[str, str | None]]:
    """Fingerprint *inputs*, run *cell* on a namespace holding them, report warnings."""
    namespace = dict(inputs)
    before = {name: codecs.fingerprint(value) for name, value in inputs.items()}
    cell(namespace)
    outputs = {name: namespace[name] for name in namespace if name in exported}
    return codecs.mutation_warnings(before, namespace, set(inputs), outputs)


MUTATED = (
    "'{}' was mutated in place (no reassignment); a downstream cell will see the "
    "pre-mutation value unless this cell exports it"
)


@pytest.mark.parametrize(
    ("value", "mutate"),
    [
        ([1, 2], lambda v: v.append(3)),
        ({"a": 1}, lambda v: v.update(b=2)),
        ({1}, lambda v: v.add(2)),
        (np.arange(100.0), lambda v: v.__setitem__(-1, 7.0)),
        (pd.DataFrame({"a": [1, 2]}), lambda v: v.__setitem__("b", 0)),
        (bytearray(b"ab"), lambda v: v.extend(b"c")),
    ],
    ids=["list", "dict", "set", "ndarray", "dataframe", "bytearray"],
)
def test_in_place_mutation_of_an_input_is_reported(value: object, mutate: Callable) -> None:
    warnings = run_cell({"v": value}, lambda ns: mutate(ns["v"]), exported=set())
    assert warnings == [
        {
            "var_name": "v",
            "message": MUTATED.format("v"),
            "suggestion": "Reassign it (x = \u2026), copy before mutating (x = x.copy()), or "
            "keep the producer and the mutation in one cell.",
        }
    ]


def test_exported_or_rebound_inputs_are_not_reported() -> None:
    assert run_cell({"v": [1]}, lambda ns: ns["v"].append(2), exported={"v"}) == []
    assert run_cell({"v": [1]}, lambda ns: ns.update(v=[9]), exported={"v"}) == []
    assert run_cell({"n": 5, "s": "x"}, lambda ns: None, exported=set()) == []


def test_deleted_input_is_reported() -> None:
    warnings = run_cell({"v": [1]}, lambda ns: ns.pop("v"), exported=set())
    assert warnings == [
        {"var_name": "v", "message": "'v' was deleted during execution", "suggestion": None}
    ]


def test_fingerprint_samples_ends_of_large_arrays() -> None:
    array = np.zeros(1000)
    before = codecs.fingerprint(array)
    array[500] = 1.0  # the middle is not sampled, as in the reference
    assert codecs.fingerprint(array) == before
    array[0] = 1.0
    assert codecs.fingerprint(array) != before
    assert codecs.fingerprint(5).digest is None  # immutable: identity only


def _edited_frame() -> pd.DataFrame:
    return pd.DataFrame({
        "a": np.arange(20.0),
        "s": [f"x{i}" for i in range(20)],
        "t": pd.date_range("2020-01-01", periods=20),
        "c": pd.Categorical(["u", "v"] * 10),
    })  # fmt: skip


FRAME_EDITS: dict[str, Callable[[pd.DataFrame], object]] = {
    "untouched": lambda df: None,
    "first row": lambda df: df.iloc.__setitem__((0, 0), 99.0),
    "last row": lambda df: df.iloc.__setitem__((19, 1), "changed"),
    "middle row": lambda df: df.iloc.__setitem__((10, 0), 99.0),
    "below JSON precision": lambda df: df.iloc.__setitem__((1, 0), 1.0 + 1e-13),
    "sign of zero": lambda df: df.iloc.__setitem__((0, 0), -0.0),
    "category": lambda df: df.iloc.__setitem__((0, 3), "v"),
    "new column": lambda df: df.__setitem__("z", 1),
    "same labels, new axis": lambda df: setattr(df, "columns", list(df.columns)),
    "column dtype": lambda df: df.__setitem__("a", df["a"].astype("float32")),
    "index replaced": lambda df: setattr(df, "index", df.index[::-1]),
}


@pytest.mark.parametrize("edit", FRAME_EDITS.values(), ids=FRAME_EDITS.keys())
def test_frame_inputs_are_compared_before_they_are_digested(edit: Callable) -> None:
    """Frames without object columns keep copies of their sampled rows and are digested
    only if those changed; the verdict is still the digest comparison's."""
    frame = _edited_frame()
    assert codecs.fingerprint(frame).frame is not None  # the copy-and-compare path
    witness = _edited_frame()
    digest_before = mutations._digest(witness)
    edit(witness)
    expected = mutations._digest(witness) != digest_before
    warnings = run_cell({"v": frame}, lambda ns: edit(ns["v"]), exported=set())
    assert [w["message"] for w in warnings] == ([MUTATED.format("v")] if expected else [])


def test_object_columns_are_digested_before_the_cell() -> None:
    """A copy of an object column shares its cells: a list edited in place would look
    unchanged, so such frames are digested up front."""
    frame = pd.DataFrame({"l": [[1], [2]], "n": [1, 2]})
    assert codecs.fingerprint(frame).frame is None
    warnings = run_cell({"v": frame}, lambda ns: ns["v"]["l"].iloc[0].append(3), set())
    assert [w["var_name"] for w in warnings] == ["v"]


def test_outputs_sharing_a_mutable_object_are_reported() -> None:
    def cell(ns: dict[str, Any]) -> None:
        shared = np.zeros(3)
        ns.update(model={"w": shared}, opt=[shared], other=[1])

    warnings = run_cell({}, cell, exported={"model", "opt", "other"})
    assert warnings == [
        {
            "var_name": "model",
            "message": "outputs 'model' and 'opt' share a mutable ndarray object; stored as "
            "separate artifacts they become independent copies downstream",
            "suggestion": "If they must stay linked (e.g. an optimizer over a model's "
            "parameters), output only one and derive the other from it in the cell that "
            "uses both.",
        }
    ]


@pytest.mark.parametrize(
    "make_outputs",
    [
        lambda: {"a": {"m": json, "f": len}, "b": [json, len]},  # shared by nature
        lambda: {"a": [("k", "v")], "b": [("k", "v")]},  # tuples are walked, not recorded
        lambda: (lambda f: {"a": f, "b": {"attrs": f.attrs}})(pd.DataFrame({"x": [1]})),
    ],
    ids=["modules-functions", "tuple", "inside-a-dataframe"],
)
def test_sharing_that_is_not_reported(make_outputs: Callable[[], dict[str, Any]]) -> None:
    outputs = make_outputs()
    if isinstance(outputs["a"], list):
        outputs["b"] = [outputs["a"][0]]  # the very same element object
    assert run_cell({}, lambda ns: ns.update(outputs), exported=set(outputs)) == []


# --- polars --------------------------------------------------------------------------------------


def test_polars_frame_and_series_round_trip(tmp_path: Path) -> None:
    frame = pl.DataFrame({"a": [1, 2, 3], "s": ["x", None, "z"], "f": [1.5, None, 2.5]})
    meta, loaded = write_and_load(tmp_path, "frame", frame)
    assert meta["content_type"] == "arrow/ipc" and meta["rows"] == 3
    assert meta["columns"] == ["a", "s", "f"]
    assert (
        stream_schema(tmp_path / str(meta["file"])).metadata[b"strata.arrow.source"]
        == b"polars.DataFrame"
    )
    assert isinstance(loaded, pl.DataFrame) and loaded.equals(frame)
    series = pl.Series("n", [1.0, 2.0])
    _, loaded_series = write_and_load(tmp_path, "series", series)
    assert isinstance(loaded_series, pl.Series)
    assert loaded_series.name == "n" and loaded_series.to_list() == [1.0, 2.0]


def test_polars_frame_reaches_a_kernel_without_polars_as_pandas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference's rule: polars where it imports, else the table as pandas."""
    meta = codecs.serialize("frame", pl.DataFrame({"a": [1, 2]}), str(tmp_path))
    monkeypatch.setitem(sys.modules, "polars", None)  # `import polars` now fails
    loaded = codecs.load_input(str(tmp_path / str(meta["file"])), "arrow/ipc")
    assert isinstance(loaded, pd.DataFrame) and loaded["a"].tolist() == [1, 2]
