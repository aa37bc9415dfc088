"""Compare our in-kernel codecs with the real Strata serializer (strata-notebook 0.11).

Run it with the interpreter that has ``strata-notebook`` installed (Python >= 3.12)::

    python reference_codecs_check.py

Our ``kernel_worker/agent/codecs.py`` is loaded by file path as the package
``strata_kernel_agent`` (as the kernels see it), so nothing needs installing. The
reference's ``serializer.py`` and ``immutability.py`` are loaded by path too, the way its
own harness loads them. For each value the script checks that:

1. both sides write the same file bytes and the same metadata (keys in the same order);
2. the reference's loader reads our file as what it reads from its own file, and ours
   reads the reference's file as the reference does;

then it compares the input-only formats, mutation warnings and ``build_env``. Both sides
run in this one interpreter, so even cloudpickled functions and classes are expected to be
byte-identical; a check that compares decoded values instead says so where it does.

Prints one line per check that fails and a summary; exits 1 if anything differs.
"""

from __future__ import annotations

import datetime
import decimal
import importlib.util
import io
import json
import math
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import types
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
from matplotlib.figure import Figure
from PIL import Image

AGENT_DIR = Path(__file__).resolve().parents[2] / "kernel_worker" / "agent"
AGENT_PACKAGE = "strata_kernel_agent"


def _load_path(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_ours() -> types.ModuleType:
    """Our codecs as the package ``strata_kernel_agent`` (its relative import resolves)."""
    package = types.ModuleType(AGENT_PACKAGE)
    package.__path__ = [str(AGENT_DIR)]
    sys.modules[AGENT_PACKAGE] = package
    return _load_path(f"{AGENT_PACKAGE}.codecs", AGENT_DIR / "codecs.py")


def load_reference() -> tuple[types.ModuleType, types.ModuleType, types.ModuleType]:
    spec = importlib.util.find_spec("strata.notebook")
    assert spec is not None and spec.submodule_search_locations is not None
    folder = Path(next(iter(spec.submodule_search_locations)))
    serializer = _load_path("_nb_serializer", folder / "serializer.py")
    immutability = _load_path("_nb_immutability", folder / "immutability.py")
    harness = _load_path("_nb_harness", folder / "harness.py")
    return serializer, immutability, harness


OURS = load_ours()
REF, REF_IMMUT, REF_HARNESS = load_reference()


class Report:
    def __init__(self) -> None:
        self.checks = 0
        self.failures: list[str] = []
        self.notes: list[str] = []

    def check(self, label: str, ok: bool, detail: str = "") -> None:
        self.checks += 1
        if not ok:
            self.failures.append(f"{label}: {detail}" if detail else label)


# --- Values ---------------------------------------------------------------------------


class Point:
    def __init__(self, x: int, y: list[int]) -> None:
        self.x, self.y = x, y


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self) -> None:
        self.a = 1


class Note:
    def _repr_markdown_(self) -> str:
        return "# Title\n\n*émphasis*"


class Pixel:
    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        Image.new("RGB", (3, 2), "red").save(buffer, format="PNG")
        return buffer.getvalue()


def _figure() -> Figure:
    figure = Figure(figsize=(2, 1.5), dpi=50)
    figure.add_subplot().plot([1, 3, 2])
    return figure


def _tables() -> list[tuple[str, object]]:
    frame = pd.DataFrame(
        {
            "i": [1, 2, None],
            "s": ["a", None, "c"],
            "t": pd.to_datetime(["2024-01-01", None, "2024-03-01"]),
            "b": [True, False, True],
        }
    )
    return [
        ("table", pa.table({"a": [1, 2, 3], "b": ["x", None, "z"]})),
        ("Batch", pa.record_batch({"a": [1.5, None]})),
        ("frame", frame),
        ("indexed", pd.DataFrame({"v": [1, 2]}, index=["r1", "r2"])),
        ("DF", pd.DataFrame({"a": range(30), "b": [f"s{i}" for i in range(30)]})),
        ("empty_frame", pd.DataFrame({"a": pd.Series([], dtype="int64")})),
        ("series", pd.Series([1.0, float("nan")], name="price")),
        ("unnamed", pd.Series([1, 2])),
        ("int_named", pd.Series(["a"], name=7)),
        ("mixed", pd.DataFrame({"a": [1, "x"], "b": [None, 2.5]})),
        ("mixed_series", pd.Series([1, "x"], name="m")),
        ("relation", duckdb.sql("select 1 as x, 'q' as y")),
        ("chunked", pa.chunked_array([[1, 2], [3]])),
        ("nested", pa.table({"l": [[1, 2], None], "m": [{"k": 1}, {"k": None}]})),
        ("pl_frame", pl.DataFrame({"a": [1, 2, None], "s": ["x", None, "z"]})),
        ("pl_series", pl.Series("n", [1.5, None])),
    ]


def _arrays() -> list[tuple[str, object]]:
    return [
        ("matrix", np.arange(6).reshape(2, 3)),
        ("f32", np.linspace(0, 1, 5, dtype=np.float32)),
        ("cplx", np.array([1 + 2j, 3 - 4j])),
        ("zero_d", np.array(3.5)),
        ("cube", np.ones((2, 2, 2), dtype=np.int8)),
        ("strided", np.arange(20).reshape(4, 5)[:, ::2]),
        ("flags", np.array([True, False])),
        ("np_int", np.int64(7)),
        ("np_float", np.float32(1.5)),
        ("np_bool", np.bool_(True)),
        ("np_str", np.str_("hi")),
        ("np_cplx", np.complex128(1 + 1j)),
    ]


def _scalars_and_objects() -> list[tuple[str, object]]:
    return [
        ("when", datetime.datetime(2020, 1, 2, 3, 4, 5)),
        ("day", datetime.date(2021, 5, 6)),
        ("clock", datetime.time(7, 8, 9)),
        ("span", datetime.timedelta(days=1, seconds=3)),
        ("money", decimal.Decimal("12.345")),
        ("raw", b"\x00ab"),
        ("buffer", bytearray(b"xyz")),
        ("ident", uuid.UUID(int=5)),
        ("z", 3 + 4j),
        ("doc", {"a": [1, 2.5, None, True], "b": {"c": "d"}}),
        ("Big", list(range(100))),
        ("nothing", None),
        ("nan", float("nan")),
        ("text", "héllo"),
        ("pair", (1, 2)),
        ("intkeys", {1: "a"}),
        ("nested_tuple", {"a": (1, 2)}),
        ("bag", {1, 2, 3}),
        ("math_mod", math),
        ("np_mod", np),
        ("Point", Point),
        ("pt", Point(1, [2])),
        ("slotted", Slotted()),
        ("square", lambda x: x * x),
        ("spans", range(3)),
        ("lock", threading.Lock()),
    ]


def _displays() -> list[tuple[str, object]]:
    return [
        ("__display__0", Note()),
        ("__display__1", Pixel()),
        ("__display__2", Image.new("L", (4, 5), 128)),
        ("__display__3", _figure()),
        ("__display__4", {"plain": "json"}),
        ("__display__5", pd.DataFrame({"a": [1]})),
        ("__display__6", np.arange(3)),
        ("_", Note()),
    ]


# --- Comparing --------------------------------------------------------------------------


def _plain(metadata: dict[str, Any]) -> str:
    """Metadata as JSON text: enum members become their strings, NaN stays visible."""
    return json.dumps(metadata, default=str)


def same_value(a: Any, b: Any) -> bool:
    """Decoded-value equality that also checks types, dtypes, names and metadata."""
    if type(a) is not type(b):
        return False
    if isinstance(a, pd.DataFrame | pd.Series):
        names_match = getattr(a, "name", None) == getattr(b, "name", None) or (
            _is_nan(getattr(a, "name", None)) and _is_nan(getattr(b, "name", None))
        )
        return bool(a.equals(b)) and str(a.dtypes) == str(b.dtypes) and names_match
    if isinstance(a, np.ndarray):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.flags.writeable == b.flags.writeable
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, pl.DataFrame | pl.Series):
        return bool(a.equals(b)) and getattr(a, "name", None) == getattr(b, "name", None)
    if isinstance(a, pa.Table | pa.RecordBatch):
        return bool(a.equals(b, check_metadata=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, types.FunctionType):
        return a.__code__.co_code == b.__code__.co_code and a.__name__ == b.__name__
    if isinstance(a, type):
        return a.__qualname__ == b.__qualname__
    if _is_nan(a):
        return _is_nan(b)
    slots = getattr(type(a), "__slots__", None)
    if slots is not None and not hasattr(a, "__dict__"):
        return [getattr(a, n, None) for n in slots] == [getattr(b, n, None) for n in slots]
    if hasattr(a, "__dict__") and not isinstance(a, types.ModuleType):
        return same_value(vars(a), vars(b))
    return bool(a == b) or a is b


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _load_both(path: Path, content_type: str) -> tuple[object, object]:
    return (
        REF.deserialize_value(content_type, path),
        OURS.load_input(str(path), content_type),
    )


def _outcome(call: Callable[[], object]) -> tuple[str, object]:
    try:
        return "value", call()
    except Exception as error:
        return "error", error


def compare_output(report: Report, name: str, value: object, root: Path) -> None:
    """Write *value* with both sides, then cross-load each side's file with the other."""
    ref_dir, our_dir = root / "ref", root / "ours"
    try:
        ref_meta: dict[str, Any] = dict(REF.serialize_value(value, ref_dir, name))
    except Exception as error:  # the reference harness turns this into an error entry
        ref_meta = {"error": str(error), "type": type(value).__name__}
    our_meta = OURS.serialize(name, value, str(our_dir), for_display=name.startswith("_"))
    report.check(
        f"{name}: metadata",
        _plain(ref_meta) == _plain(our_meta),
        f"reference {_plain(ref_meta)} != ours {_plain(our_meta)}",
    )
    if "file" not in ref_meta or "file" not in our_meta:
        leftovers = list(our_dir.glob(OURS.file_stem(name) + ".*"))
        report.check(f"{name}: no file left on error", not leftovers, f"{leftovers}")
        return
    ref_file, our_file = ref_dir / str(ref_meta["file"]), our_dir / str(our_meta["file"])
    report.check(
        f"{name}: file bytes",
        ref_file.read_bytes() == our_file.read_bytes(),
        f"{ref_file.stat().st_size} vs {our_file.stat().st_size} bytes",
    )
    content_type = str(ref_meta["content_type"])
    if content_type == "image/png":
        return  # display-only: no reader on either side
    _cross_load(report, name, content_type, ref_file, our_file)


def _cross_load(
    report: Report, name: str, content_type: str, ref_file: Path, our_file: Path
) -> None:
    baseline = _outcome(lambda: REF.deserialize_value(content_type, ref_file))
    readings: dict[str, Callable[[], object]] = {
        "reference reads our file": lambda: REF.deserialize_value(content_type, our_file),
        "we read the reference's file": lambda: OURS.load_input(str(ref_file), content_type),
        "we read our file": lambda: OURS.load_input(str(our_file), content_type),
    }
    for label, read in readings.items():
        got = _outcome(read)
        ok = got[0] == baseline[0] and (
            same_value(baseline[1], got[1])
            if got[0] == "value"
            else str(got[1]) == str(baseline[1])
        )
        report.check(f"{name}: {label}", ok, f"{baseline!r:.120} vs {got!r:.120}")


@contextmanager
def env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def check_outputs(report: Report, root: Path) -> None:
    cases = _tables() + _arrays() + _scalars_and_objects() + _displays()
    for index, (name, value) in enumerate(cases):
        compare_output(report, name, value, root / f"case{index}")
    with env(STRATA_NOTEBOOK_OBJECT_CODEC="pickle"):
        compare_output(report, "pickle_codec_tuple", (1, "a"), root / "codec1")
        compare_output(report, "pickle_codec_lambda", lambda: 1, root / "codec2")
    with env(STRATA_NOTEBOOK_OBJECT_CODEC="bogus"):
        compare_output(report, "bogus_codec", {1, 2}, root / "codec3")


# --- Input-only formats -----------------------------------------------------------------


def _write_descriptor(folder: Path, name: str, symbol: str, source: str) -> Path:
    path = folder / f"{name}.cell_module.json"
    descriptor = {
        "module_name": name,
        "symbol_name": symbol,
        "kind": "function",
        "source": source,
        "provenance_hash": "x",
        "injected": {},
    }
    path.write_text(json.dumps(descriptor), encoding="utf-8")
    return path


CELL_SOURCE = (
    "class Counter:\n"
    "    def __init__(self, start):\n"
    "        self.count = start + offset\n"
    "    def bump(self):\n"
    "        self.count += 1\n"
    "        return self.count\n"
    "def helper(x):\n"
    "    return x * offset\n"
    "class Slots:\n"
    "    __slots__ = ('a', 'b')\n"
    "class Stateful:\n"
    "    def __init__(self):\n"
    "        self.n, self.cache = 1, 'expensive'\n"
    "    def __getstate__(self):\n"
    "        return {'n': self.n}\n"
    "    def __setstate__(self, state):\n"
    "        self.n, self.cache = state['n'], None\n"
)


def check_cell_modules(report: Report, root: Path) -> None:
    """module/cell on both sides (separate module names), then cell instances across."""
    root.mkdir()
    ref_path = _write_descriptor(root, "nb_ref_mod", "helper", CELL_SOURCE)
    our_path = _write_descriptor(root, "nb_our_mod", "helper", CELL_SOURCE)
    ref_helper = REF.deserialize_cell_module_with_injection(ref_path, {"offset": 10})
    our_helper = OURS.load_input(str(our_path), "module/cell", injected={"offset": 10})
    report.check("module/cell: injected value used", ref_helper(2) == our_helper(2) == 20)
    ref_mod, our_mod = sys.modules["nb_ref_mod"], sys.modules["nb_our_mod"]
    for attr in ("__strata_cell_module_source__", "__strata_cell_module__", "__file__"):
        ref_attr, our_attr = getattr(ref_mod, attr), getattr(our_mod, attr)
        if attr == "__file__":
            ref_attr, our_attr = Path(ref_attr).name, Path(our_attr).name.replace("our", "ref")
        report.check(f"module/cell: module {attr}", ref_attr == our_attr)
    report.check(
        "module/cell: class tagged",
        getattr(our_mod.Counter, "__strata_cell_exported_class__", False)
        and getattr(ref_mod.Counter, "__strata_cell_exported_class__", False),
    )
    for side, module in (("ref", ref_mod), ("ours", our_mod)):
        counter, slots, stateful = module.Counter(1), module.Slots(), module.Stateful()
        counter.bump()
        slots.a = [1]
        stateful.n = 4
        for name, value in (("counter", counter), ("slots", slots), ("stateful", stateful)):
            compare_output(report, f"{name}_{side}", value, root / f"{name}_{side}")
    _check_missing_symbol(report, root)


def _check_missing_symbol(report: Report, root: Path) -> None:
    path = _write_descriptor(root, "nb_missing_mod", "absent", "x = 1\n")
    ref_kind, _ = _outcome(lambda: REF.deserialize_value("module/cell", path))
    our_kind, _ = _outcome(lambda: OURS.load_input(str(path), "module/cell"))
    report.check("module/cell: missing symbol raises", ref_kind == our_kind == "error")


def _make_tar(path: Path, members: dict[str, bytes], links: dict[str, str]) -> None:
    with tarfile.open(path, "w") as archive:
        for member_name, data in members.items():
            info = tarfile.TarInfo(member_name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for link_name, target in links.items():
            info = tarfile.TarInfo(link_name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            archive.addfile(info)


def _tar_outcomes(
    root: Path, label: str, members: dict[str, bytes], links: dict[str, str]
) -> tuple[tuple[str, object], tuple[str, object]]:
    outcomes = []
    for side in ("ref", "ours"):
        folder = root / label / side
        folder.mkdir(parents=True)
        tar_path = folder / "data.dir.tar"
        _make_tar(tar_path, members, links)
        if side == "ref":
            outcomes.append(_outcome(lambda p=tar_path: REF.deserialize_value("dir/tar", p)))
        else:
            outcomes.append(_outcome(lambda p=tar_path: OURS.load_input(str(p), "dir/tar")))
    return outcomes[0], outcomes[1]


def check_dir_tar(report: Report, root: Path) -> None:
    good = {"a.txt": b"A", "sub/b.txt": b"B"}
    (ref_kind, ref_dir), (our_kind, our_dir) = _tar_outcomes(root, "good", good, {"l": "a.txt"})
    report.check("dir/tar: safe archive extracted", ref_kind == our_kind == "value")
    if ref_kind == our_kind == "value":
        assert isinstance(ref_dir, Path) and isinstance(our_dir, Path)
        listing = [sorted(str(p.relative_to(d)) for p in d.rglob("*")) for d in (ref_dir, our_dir)]
        report.check(
            "dir/tar: same folder name and content",
            ref_dir.name == our_dir.name == "data.dir" and listing[0] == listing[1],
            f"{listing}",
        )
    for label, members, links in (
        ("dotdot", {"../evil.txt": b"x"}, {}),
        ("link_out", {}, {"l": "../../etc/passwd"}),
        ("abs_link", {}, {"l": "/etc/passwd"}),
    ):
        (ref_kind, _), (our_kind, _) = _tar_outcomes(root, label, members, links)
        report.check(f"dir/tar: {label} refused by both", ref_kind == our_kind == "error")
    # an absolute member lands inside the folder on both sides ("data" drops the leading "/")
    absolute = {"/tmp/x.txt": b"x"}
    (ref_kind, ref_dir), (our_kind, our_dir) = _tar_outcomes(root, "absolute", absolute, {})
    report.check("dir/tar: absolute member extracted by both", ref_kind == our_kind == "value")
    if ref_kind == our_kind == "value":
        assert isinstance(ref_dir, Path) and isinstance(our_dir, Path)
        contents = [(d / "tmp" / "x.txt").read_bytes() for d in (ref_dir, our_dir)]
        report.check("dir/tar: absolute member at the same place", contents == [b"x", b"x"])


def check_simple_inputs(report: Report, root: Path) -> None:
    root.mkdir()
    (root / "notes.md").write_text("# hi\nthere", encoding="utf-8")
    (root / "__fetch_0_data.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    (root / "v.bin").write_bytes(b"RDS")
    bare = root / "legacy.pickle"
    bare.write_bytes(__import__("pickle").dumps(b"payload" * 10))
    for file_name, content_type in (
        ("notes.md", "text/markdown"),
        ("__fetch_0_data.csv", "file/path"),
        ("legacy.pickle", "pickle/object"),
        ("v.bin", "application/x-r-rds"),
        ("v.bin", "image/png"),
        ("v.bin", "no/such-type"),
    ):
        path = root / file_name
        ref = _outcome(lambda p=path, c=content_type: REF.deserialize_value(c, p))
        ours = _outcome(lambda p=path, c=content_type: OURS.load_input(str(p), c))
        if ref[0] == ours[0] == "error":
            ok, detail = str(ref[1]) == str(ours[1]), f"{ref[1]} != {ours[1]}"
        else:
            ok, detail = ref[0] == ours[0] and same_value(ref[1], ours[1]), f"{ref} != {ours}"
        report.check(f"input {content_type}", ok, detail)


# --- Mutation warnings, names, build env -------------------------------------------------


def _mutation_scenarios() -> list[tuple[str, dict[str, Any], Callable[[dict[str, Any]], set[str]]]]:
    def append(ns: dict[str, Any]) -> set[str]:
        ns["v"].append(4)
        return set()

    def append_exported(ns: dict[str, Any]) -> set[str]:
        ns["v"].append(4)
        return {"v"}

    def delete(ns: dict[str, Any]) -> set[str]:
        del ns["v"]
        return set()

    def rebind(ns: dict[str, Any]) -> set[str]:
        ns["v"] = ns["v"] + [1]
        return {"v"}

    def many(ns: dict[str, Any]) -> set[str]:
        ns["d"]["new"] = 1
        ns["df"]["c"] = 1
        ns["arr"][0] = 99
        ns["s"].add(9)
        ns["p"].x = 5
        ns["w"], ns["x"] = ns["v"], [ns["v"], ns["arr"]]
        ns["y"] = {"k": ns["arr"]}
        return {"w", "x", "y"}

    def opaque(ns: dict[str, Any]) -> set[str]:
        pair = ("k", ns["v"])
        ns["a"], ns["b"] = [pair], [pair]
        ns["frame"], ns["meta"] = ns["df"], {"attrs": ns["df"].attrs}
        ns["m1"], ns["m2"] = {"np": np, "f": len}, [np, len]
        return {"a", "b", "frame", "meta", "m1", "m2"}

    base = {"v": [1, 2, 3], "n": 5, "t": "text"}
    richer = {
        **base,
        "d": {"a": 1},
        "df": pd.DataFrame({"a": range(10)}),
        "arr": np.arange(12.0),
        "s": {1},
        "p": Point(1, [2]),
    }
    return [
        ("append", base, append),
        ("append_exported", base, append_exported),
        ("delete", base, delete),
        ("rebind", base, rebind),
        ("many", richer, many),
        *_frame_mutation_scenarios(),
    ]


def _frame_mutation_scenarios() -> list[tuple[str, dict[str, Any], Callable[..., set[str]]]]:
    """In-place edits of DataFrame and Series inputs: sampled rows, axes, dtypes, and
    changes the reference's digest does not see (middle rows, below its JSON precision)."""
    frame = pd.DataFrame({
        "a": np.arange(20.0),
        "s": [f"x{i}" for i in range(20)],
        "t": pd.date_range("2020-01-01", periods=20),
        "c": pd.Categorical(["u", "v"] * 10),
        "i": pd.array(range(20), dtype="Int64"),
    })  # fmt: skip
    edits: dict[str, Callable[[pd.DataFrame], object]] = {
        "untouched": lambda df: None,
        "first row": lambda df: df.iloc.__setitem__((0, 0), 99.0),
        "last row": lambda df: df.iloc.__setitem__((19, 0), 99.0),
        "middle row": lambda df: df.iloc.__setitem__((10, 0), 99.0),
        "below JSON precision": lambda df: df.iloc.__setitem__((1, 0), 1.0 + 1e-13),
        "sign of zero": lambda df: df.iloc.__setitem__((0, 0), -0.0),
        "string cell": lambda df: df.iloc.__setitem__((0, 1), "changed"),
        "category cell": lambda df: df.iloc.__setitem__((0, 3), "v"),
        "nullable cell": lambda df: df.iloc.__setitem__((0, 4), pd.NA),
        "new column": lambda df: df.__setitem__("z", 1),
        "renamed column": lambda df: df.rename(columns={"a": "b"}, inplace=True),
        "same labels, new axis": lambda df: setattr(df, "columns", list(df.columns)),
        "column dtype": lambda df: df.__setitem__("a", df["a"].astype("float32")),
        "sorted": lambda df: df.sort_values("a", ascending=False, inplace=True),
        "index name": lambda df: setattr(df.index, "name", "k"),
        "row dropped": lambda df: df.drop(index=19, inplace=True),
    }

    def cell_of(edit: Callable[[pd.DataFrame], object]) -> Callable[..., set[str]]:
        def cell(ns: dict[str, Any]) -> set[str]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pandas deprecates some inplace= edits
                edit(ns["df"])
            return set()

        return cell

    def series_cell(ns: dict[str, Any]) -> set[str]:
        ns["s1"].iloc[0] = -1.0
        ns["s2"].iloc[5] = -1.0  # the middle of 12 values: not sampled
        return set()

    def object_cell(ns: dict[str, Any]) -> set[str]:
        ns["df"]["l"].iloc[0].append(3)  # an object column: a list edited in place
        return set()

    scenarios = [(f"frame: {label}", {"df": frame}, cell_of(e)) for label, e in edits.items()]
    series = {"s1": pd.Series(np.arange(12.0)), "s2": pd.Series(np.arange(12.0))}
    scenarios.append(("series: first and middle values", series, series_cell))
    objects = {"df": pd.DataFrame({"l": [[1], [2]], "n": [1, 2]})}
    scenarios.append(("frame: object column edited in place", objects, object_cell))
    return scenarios


def check_mutations(report: Report) -> None:
    import copy

    for label, template, cell in _mutation_scenarios():
        results = []
        for side in ("ref", "ours"):
            ns = copy.deepcopy(template)
            names = list(ns)
            if side == "ref":
                snapshots = REF_IMMUT.snapshot_inputs(ns, names)
            else:
                before = {n: OURS.fingerprint(ns[n]) for n in names}
            exported = cell(ns)
            outputs = {n: ns[n] for n in ns if n in exported}
            if side == "ref":
                found = list(REF_IMMUT.detect_mutations(ns, snapshots, exported_names=exported))
                found += REF_IMMUT.detect_shared_mutable_outputs(outputs)
            else:
                found = OURS.mutation_warnings(before, ns, set(names), outputs)
            results.append(json.dumps(found))
        report.check(
            f"mutation warnings: {label}",
            results[0] == results[1],
            f"reference {results[0]} != ours {results[1]}",
        )


def check_names(report: Report) -> None:
    for name in ("df", "DF", "Big", "K", "Data", "x_1", "__display__0", "ÄB", "camelCase"):
        report.check(f"file stem {name!r}", OURS.file_stem(name) == REF._safe_filename_stem(name))
    report.check(
        "build_env",
        OURS.build_env() == REF_HARNESS.build_env_identity(),
        f"{OURS.build_env()} != {REF_HARNESS.build_env_identity()}",
    )
    for ext, content_type in REF.EXT_TO_CONTENT_TYPE.items():
        if ext != ".rds":  # R blobs are never inputs we name; the client sends them as .bin
            ours = OURS.extension_for(str(content_type))
            report.check(f"extension {content_type}", ours == ext, f"{ours} != {ext}")


def main() -> int:
    report = Report()
    root = Path(tempfile.mkdtemp(prefix="codecs-interop-"))
    try:
        check_names(report)
        check_outputs(report, root / "outputs")
        check_cell_modules(report, root / "cells")
        check_dir_tar(report, root / "tars")
        check_simple_inputs(report, root / "inputs")
        check_mutations(report)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for failure in report.failures:
        print(f"MISMATCH {failure}")
    for note in report.notes:
        print(f"note: {note}")
    print(f"{report.checks - len(report.failures)}/{report.checks} checks agree")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
