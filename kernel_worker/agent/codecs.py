"""How cell inputs are read and cell outputs written, byte-compatible with Strata 0.11.

This module runs inside the Jupyter kernel: it is shipped as source and executed as
``strata_kernel_agent.codecs`` next to ``arrow_codec``. Module-level imports are the
standard library only; everything else is imported where it is used.

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
import collections.abc
import contextlib
import hashlib
import importlib
import io
import json
import os
import pickle
import platform
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from . import archives, arrow_codec, arrow_read, figures
from .archives import ArchiveTooLargeError, UnsafeArchiveError
from .arrow_codec import removed_on_error
from .arrow_read import X64_NOTE, PrecisionError, x64_was_enabled_here

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

ARROW = "arrow/ipc"
JSON = "json/object"
PICKLE = "pickle/object"
PNG = "image/png"
MARKDOWN = "text/markdown"
MODULE_IMPORT = "module/import"
MODULE_CELL = "module/cell"
CELL_INSTANCE = "module/cell-instance"
FILE_PATH = "file/path"
DIR_TAR = "dir/tar"
DIR_MANIFEST = "dir/manifest"
R_OBJECT = "application/x-r-rds"

_EXTENSIONS = {
    ARROW: ".arrow",
    JSON: ".json",
    PICKLE: ".pickle",
    MODULE_IMPORT: ".module.json",
    MODULE_CELL: ".cell_module.json",
    CELL_INSTANCE: ".cell_instance.pickle",
    DIR_TAR: ".dir.tar",
    MARKDOWN: ".md",
    PNG: ".png",
}

CODEC_ENV_VAR = "STRATA_NOTEBOOK_OBJECT_CODEC"
_ENVELOPE_KEY = "__strata_object_codec__"
_ENVELOPE_TAG = "strata.notebook.object_codec.v1"
_STATE_KEY = "__strata_cell_instance_state__"
_STATE_TAG = "strata.notebook.cell_instance_state.v1"
_MODULE_SOURCE_ATTR = "__strata_cell_module_source__"
_MODULE_FLAG_ATTR = "__strata_cell_module__"
_EXPORTED_CLASS_ATTR = "__strata_cell_exported_class__"

Metadata = dict[str, object]


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


# --- Names --------------------------------------------------------------------------


def file_stem(name: str) -> str:
    """*name* itself when it is all lower case, else ``name-<8 hex of its sha256>``.

    The suffix keeps ``df`` and ``DF`` apart on case-insensitive file systems.
    """
    if name == name.lower():
        return name
    return f"{name}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def extension_for(content_type: str) -> str:
    """The file extension a value of *content_type* is stored under (``.bin`` if none)."""
    return _EXTENSIONS.get(content_type, ".bin")


def build_env() -> str:
    """``<implementation>-<major.minor>-<sys.platform>-<machine>``, recorded per result."""
    major, minor = sys.version_info[:2]
    implementation = platform.python_implementation().lower()
    return f"{implementation}-{major}.{minor}-{sys.platform}-{platform.machine()}"


# --- Object codec (pickle envelope) -------------------------------------------------


def _codec_name(requested: str | None = None) -> str:
    """The object codec to use: *requested*, else the env setting, else cloudpickle."""
    name = (requested or os.environ.get(CODEC_ENV_VAR, "cloudpickle")).strip().lower()
    if name not in ("cloudpickle", "pickle"):
        # Wording kept identical to the reference's: it reaches results as an error entry.
        raise ValueError(
            f"Unknown notebook object codec {name!r}. Supported codecs: pickle, cloudpickle"
        )
    if name == "cloudpickle":
        try:
            import cloudpickle  # noqa: F401
        except ImportError:
            return "pickle"
    return name


def _dumps(codec: str, value: object) -> bytes:
    if codec == "cloudpickle":
        import cloudpickle

        return bytes(cloudpickle.dumps(value, protocol=5))
    return pickle.dumps(value, protocol=5)


def _loads(codec: str, payload: bytes) -> object:
    _codec_name(codec)  # rejects codecs we do not know
    return pickle.loads(payload)


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


def _has_markdown(value: object) -> bool:
    return callable(getattr(value, "_repr_markdown_", None))


def _is_image(value: object) -> bool:
    if callable(getattr(value, "_repr_png_", None)):
        return True
    if figures.is_figure(value):
        return True
    image = sys.modules.get("PIL.Image")
    return image is not None and isinstance(value, image.Image)


def _is_cell_instance(value: object) -> bool:
    if isinstance(value, type) or not getattr(type(value), _EXPORTED_CLASS_ATTR, False):
        return False
    source = getattr(sys.modules.get(type(value).__module__), _MODULE_SOURCE_ATTR, None)
    return isinstance(source, str) and bool(source)


def detect_content_type(value: object, *, for_display: bool = False) -> str:
    """The content type *value* is stored as; the first matching rule wins.

    Arrow-shaped values, then (displays only) markdown and PNG, JSON that round-trips,
    modules, instances of classes that arrived as ``module/cell``, and pickle for the rest.
    """
    if arrow_codec.is_arrow_value(value):
        return ARROW
    if for_display and _has_markdown(value):
        return MARKDOWN
    if for_display and _is_image(value):
        return PNG
    if _is_json_value(value):
        return JSON
    if isinstance(value, types.ModuleType):
        return MODULE_IMPORT
    if _is_cell_instance(value):
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
        kind = detect_content_type(value, for_display=for_display or _is_display_name(name))
        return _WRITERS[kind](value, stem)
    except Exception as error:
        return {"error": str(error), "type": type(value).__name__}


def _target(stem: Path, content_type: str) -> Path:
    return stem.with_name(stem.name + extension_for(content_type))


def _written(content_type: str, path: Path, **extra: object) -> Metadata:
    """Metadata in the reference's key order: type, file, size, then the extras."""
    head: Metadata = {"content_type": content_type, "file": path.name}
    return {**head, "bytes": os.path.getsize(path), **extra}


def _write_arrow(value: object, stem: Path) -> Metadata:
    path = _target(stem, ARROW)
    try:
        return arrow_codec.write(value, path)
    except Exception as error:
        if arrow_codec.is_pandas(value) and arrow_codec.wants_json_table(error):
            return arrow_codec.write_json_table(value, path)
        return _write_pickle(value, stem)


def _write_json(value: object, stem: Path) -> Metadata:
    path = _target(stem, JSON)
    with removed_on_error(path), open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2)
    return _written(JSON, path, preview=value)


def _write_module(value: object, stem: Path) -> Metadata:
    module_name = getattr(value, "__name__", stem.name)
    path = _target(stem, MODULE_IMPORT)
    with removed_on_error(path), open(path, "w", encoding="utf-8") as f:
        json.dump({"module_name": module_name}, f)
    return _written(MODULE_IMPORT, path, preview=f"<module '{module_name}'>")


def _write_pickle(value: object, stem: Path) -> Metadata:
    codec = _codec_name()
    envelope = {_ENVELOPE_KEY: _ENVELOPE_TAG, "codec": codec, "payload": _dumps(codec, value)}
    path = _target(stem, PICKLE)
    with removed_on_error(path), open(path, "wb") as f:
        pickle.dump(envelope, f, protocol=5)
    kind = type(value).__name__
    return _written(PICKLE, path, codec=codec, type=kind, preview=f"<{kind} object>")


def _write_cell_instance(value: object, stem: Path) -> Metadata:
    cls = type(value)
    source = getattr(sys.modules.get(cls.__module__), _MODULE_SOURCE_ATTR, None)
    if not isinstance(source, str) or not source:
        raise ValueError(
            f"Cannot store this {cls.__name__} instance: the source of its notebook "
            f"module {cls.__module__!r} is no longer available"
        )
    codec = _codec_name()
    record = {
        "module_name": cls.__module__,
        "class_name": cls.__name__,
        "source": source,
        "state_codec": codec,
        "state_payload": _dumps(codec, _instance_state(value)),
    }
    path = _target(stem, CELL_INSTANCE)
    with removed_on_error(path), open(path, "wb") as f:
        pickle.dump(record, f, protocol=5)
    kind = cls.__name__
    return _written(CELL_INSTANCE, path, codec=codec, type=kind, preview=f"<{kind} object>")


def _markdown_text(value: object) -> str:
    text = value._repr_markdown_()  # type: ignore[attr-defined]
    if isinstance(text, bytes):
        return text.decode("utf-8")
    if isinstance(text, str):
        return text
    raise ValueError("_repr_markdown_() returned neither str nor UTF-8 bytes")


def _write_markdown(value: object, stem: Path) -> Metadata:
    text = _markdown_text(value)
    path = _target(stem, MARKDOWN)
    with removed_on_error(path):
        path.write_text(text, encoding="utf-8")
    return _written(MARKDOWN, path, markdown_text=text, preview=None)


def _write_png(value: object, stem: Path) -> Metadata:
    png, width, height = _render_png(value)
    if width is None or height is None:
        width, height = _png_size(png)
    path = _target(stem, PNG)
    with removed_on_error(path), open(path, "wb") as f:
        f.write(png)
    data_url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return _written(PNG, path, inline_data_url=data_url, width=width, height=height, preview=None)


_Png = tuple[bytes, int | None, int | None]


def _render_png(value: Any) -> _Png:
    """PNG bytes from ``_repr_png_``, a matplotlib figure or a PIL image, in that order."""
    render = getattr(value, "_repr_png_", None)
    raw = render() if callable(render) else None
    if isinstance(raw, str):  # IPython's own Image gives base64, as its PNG formatter may
        return _png_of_base64(raw) or raw.encode("latin1"), None, None
    if isinstance(raw, bytes | bytearray | memoryview):
        return bytes(raw), None, None
    if raw is not None:
        raise ValueError("_repr_png_() did not return bytes")
    if figures.is_figure(value):
        size = (value.get_figwidth() * value.dpi, value.get_figheight() * value.dpi)
        return figures.figure_png(value), round(size[0]), round(size[1])
    buffer = io.BytesIO()
    image = sys.modules.get("PIL.Image")
    if image is not None and isinstance(value, image.Image):
        value.save(buffer, format="PNG")
        return buffer.getvalue(), value.size[0], value.size[1]
    raise ValueError(f"Cannot render {type(value).__name__} as image/png")


def _png_of_base64(text: str) -> bytes | None:
    """The PNG ``text`` holds in base64 (the bytes Jupyter shows), or None if it holds none."""
    if not text.startswith("iVBORw0KGg"):  # the PNG signature, in base64
        return None
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error is one
        return None


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
    MARKDOWN: _write_markdown,
    PNG: _write_png,
    JSON: _write_json,
    MODULE_IMPORT: _write_module,
    CELL_INSTANCE: _write_cell_instance,
    PICKLE: _write_pickle,
}


# --- Cell-exported instances ----------------------------------------------------------


def _slot_names(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        declared = klass.__dict__.get("__slots__", ())
        for slot in [declared] if isinstance(declared, str) else declared:
            if slot not in ("__dict__", "__weakref__") and slot not in names:
                names.append(slot)
    return names


def _instance_state(value: object) -> object:
    """``__getstate__()`` when the class defines one, else its tagged dict/slots state."""
    custom = getattr(type(value), "__getstate__", None)
    if callable(custom) and custom is not object.__getstate__:
        return value.__getstate__()
    attrs = dict(value.__dict__) if hasattr(value, "__dict__") else None
    slots = {n: getattr(value, n) for n in _slot_names(type(value)) if hasattr(value, n)}
    if attrs is None and not slots:
        return None
    return {_STATE_KEY: _STATE_TAG, "dict": attrs, "slots": slots}


def _restore_state(instance: Any, state: object, class_name: str) -> None:
    if callable(getattr(instance, "__setstate__", None)):
        instance.__setstate__(state)
    elif isinstance(state, dict) and state.get(_STATE_KEY) == _STATE_TAG:
        attrs, slots = state.get("dict"), state.get("slots")
        if attrs is not None and not isinstance(attrs, dict):
            raise ValueError(f"Stored {class_name} state: 'dict' is not a dict")
        if slots is not None and not isinstance(slots, dict):
            raise ValueError(f"Stored {class_name} state: 'slots' is not a dict")
        if attrs is not None:
            instance.__dict__.update(attrs)
        for slot, slot_value in (slots or {}).items():
            if not isinstance(slot, str):
                raise ValueError(f"Stored {class_name} state: slot name {slot!r} is not a str")
            setattr(instance, slot, slot_value)
    elif isinstance(state, dict):
        instance.__dict__.update(state)
    elif state is not None:
        raise ValueError(f"Cannot restore a {class_name} instance: it has no __setstate__")


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
        return _load_cell_module(file_path, injected)
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


def _load_pickle(path: Path) -> object:
    with open(path, "rb") as f:
        stored = pickle.load(f)
    if not isinstance(stored, dict) or stored.get(_ENVELOPE_KEY) != _ENVELOPE_TAG:
        return stored  # an older artifact: the pickle is the value itself
    codec, payload = stored.get("codec"), stored.get("payload")
    if not isinstance(codec, str) or not isinstance(payload, bytes):
        raise ValueError("Malformed object codec envelope: needs a str codec and bytes payload")
    return _loads(codec, payload)


def _load_module(path: Path) -> object:
    with open(path, encoding="utf-8") as f:
        return importlib.import_module(json.load(f)["module_name"])


def _cell_module(
    name: str, source: str, path: Path, injected: Mapping[str, object] | None
) -> types.ModuleType:
    """The synthetic module *name*, built from *source* once per process, then tagged."""
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name)
        module.__file__ = str(path)
        module.__dict__.update(injected or {})
        sys.modules[name] = module  # before running it, like any import
        try:
            exec(compile(source, name, "exec"), module.__dict__)
        except BaseException:
            del sys.modules[name]  # a long-lived kernel must not keep a broken module
            raise
    setattr(module, _MODULE_SOURCE_ATTR, source)
    setattr(module, _MODULE_FLAG_ATTR, True)
    for member in list(module.__dict__.values()):
        if isinstance(member, type) and getattr(member, "__module__", None) == name:
            # A class that refuses new attributes simply stays untagged.
            with contextlib.suppress(AttributeError, TypeError):
                setattr(member, _EXPORTED_CLASS_ATTR, True)
    return module


def _load_cell_module(path: Path, injected: Mapping[str, object] | None) -> object:
    descriptor = _load_json(path)
    if not isinstance(descriptor, dict):
        raise ValueError("A module/cell descriptor must be a JSON object")
    name, symbol, source = (descriptor.get(k) for k in ("module_name", "symbol_name", "source"))
    if not isinstance(name, str) or not isinstance(symbol, str):
        raise ValueError("A module/cell descriptor needs string module_name and symbol_name")
    if not isinstance(source, str):
        raise ValueError(f"The module/cell descriptor for {name!r} has no source text")
    module = _cell_module(name, source, path, injected)
    if not hasattr(module, symbol):
        raise ValueError(f"Notebook module {name!r} does not define {symbol!r}")
    return getattr(module, symbol)


def _load_cell_instance(path: Path) -> object:
    with open(path, "rb") as f:
        record = pickle.load(f)
    if not isinstance(record, dict):
        raise ValueError("A module/cell-instance file must hold a dict")
    name, class_name, source = (record.get(k) for k in ("module_name", "class_name", "source"))
    if not isinstance(name, str) or not isinstance(class_name, str):
        raise ValueError("A module/cell-instance record needs string module_name and class_name")
    if not isinstance(source, str):
        raise ValueError(f"The stored {class_name} instance has no module source text")
    cls = getattr(_cell_module(name, source, path, None), class_name, None)
    if not isinstance(cls, type):
        raise ValueError(f"Notebook module {name!r} does not define class {class_name!r}")
    if "state_payload" in record and "state_codec" in record:
        codec, payload = record["state_codec"], record["state_payload"]
        if not isinstance(codec, str) or not isinstance(payload, bytes):
            raise ValueError(f"The stored {class_name} instance has a malformed state")
        state = _loads(codec, payload)
    else:
        state = pickle.loads(record["state_pickle"])  # the first version of the format
    instance = cls.__new__(cls)
    _restore_state(instance, state, class_name)
    return instance


def _load_r_object(path: Path) -> object:
    raise RArtifactError(path)


_READERS: dict[str, Callable[[Path], object]] = {
    ARROW: arrow_read.read,
    JSON: _load_json,
    PICKLE: _load_pickle,
    MARKDOWN: lambda path: path.read_text(encoding="utf-8"),
    MODULE_IMPORT: _load_module,
    CELL_INSTANCE: _load_cell_instance,
    FILE_PATH: lambda path: path,
    DIR_TAR: archives.unpack,
    DIR_MANIFEST: lambda path: path.with_name(path.name.removesuffix(".dirmanifest.json") + ".dir"),
    R_OBJECT: _load_r_object,
}


# --- Mutation warnings --------------------------------------------------------------
# Inputs are fingerprinted before the cell runs and compared afterwards. Fingerprints
# sample a few elements only (they run on every input of every cell) and never raise.

_SAMPLE = 5
_KEY_REPR_CHARS = 64
_IMMUTABLE = (str, bytes, int, float, bool, complex, type(None))
# Referenced from many places by design; two outputs both using numpy share nothing.
_SHARED_BY_NATURE = (
    types.ModuleType,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    type,
)
_MUTATED_HINT = (
    "Reassign it (x = \u2026), copy before mutating (x = x.copy()), or keep the "
    "producer and the mutation in one cell."
)
_SHARED_HINT = (
    "If they must stay linked (e.g. an optimizer over a model's parameters), output "
    "only one and derive the other from it in the cell that uses both."
)

MutationWarning = dict[str, str | None]


class InputSnapshot(NamedTuple):
    """What ``fingerprint`` records: the input's identity and a sampled content digest.

    For a pandas value whose cells cannot change under a copy (no ``object`` columns),
    ``frame`` holds copies of the sampled rows instead, and the digest is only computed if
    the value no longer equals them after the cell.
    """

    identity: int
    digest: str | None
    frame: _FrameSample | None = None


def fingerprint(value: object) -> InputSnapshot:
    """Snapshot *value* before the cell runs (digest None: only identity is tracked)."""
    sample = _FrameSample.take(value) if _is_frame(value) else None
    if sample is not None:
        return InputSnapshot(id(value), None, sample)
    return InputSnapshot(id(value), _digest(value))


class _FrameSample:
    """Copies of a DataFrame's or Series' first and last rows, and its axes' identities.

    Digesting a frame (``to_json`` of those rows) costs 0.5-5 ms; copying the rows and,
    after the cell, comparing them costs a tenth of that. Exactly equal rows, dtypes and
    axes give the same digest, so only a frame that compares unequal is digested (from the
    copies, for the before side): the verdict stays the digest comparison's.
    """

    __slots__ = ("columns", "head", "index", "length", "tail")

    def __init__(self, value: Any) -> None:
        self.index = value.index  # pandas axes are immutable: assigning one makes a new one
        self.columns = getattr(value, "columns", None)
        self.length = len(value)
        self.head = value.head(_SAMPLE).copy()
        self.tail = value.tail(_SAMPLE).copy() if self.length > _SAMPLE else None

    @classmethod
    def take(cls, value: Any) -> _FrameSample | None:
        """A sample, or None where a copy could share mutable cells (``object`` columns)."""
        try:
            dtypes = [value.dtype] if value.ndim == 1 else list(value.dtypes)
            if not all(_copies_cells(dtype) for dtype in dtypes):
                return None
            return cls(value)
        except Exception:
            return None

    def unchanged(self, value: Any) -> bool:
        try:
            return (
                value.index is self.index
                and getattr(value, "columns", None) is self.columns
                and len(value) == self.length
                and self.head.equals(value.head(_SAMPLE))
                and (self.tail is None or self.tail.equals(value.tail(_SAMPLE)))
            )
        except Exception:
            return False

    def digest(self) -> str | None:
        """The digest the value had when sampled (what ``_digest`` gave then)."""
        try:
            shape = (self.length, *self.head.shape[1:])
            return _hashed(_frame_parts(shape, self.head.dtypes, self.head, self.tail))
        except Exception:
            return None


def _copies_cells(dtype: Any) -> bool:
    """Whether copying a column of *dtype* copies its cells' values (no shared objects)."""
    if getattr(dtype, "kind", "O") in "biufcmM":
        return True
    return type(dtype).__name__ in ("StringDtype", "CategoricalDtype", "PeriodDtype")


_is_frame = arrow_codec.is_pandas
_is_ndarray = arrow_codec.instance_of("numpy", "ndarray")
_is_tensor = arrow_codec.instance_of("torch", "Tensor")


def _pandas_sample(value: Any) -> list[bytes]:
    tail = value.tail(_SAMPLE) if len(value) > _SAMPLE else None
    return _frame_parts(value.shape, value.dtypes, value.head(_SAMPLE), tail)


def _frame_parts(shape: tuple[int, ...], dtypes: Any, head: Any, tail: Any) -> list[bytes]:
    dtypes = dtypes.to_dict() if hasattr(dtypes, "to_dict") else dtypes
    parts = [str(shape), str(dtypes), head.to_json()]
    if tail is not None:
        parts.append(tail.to_json())
    return [p.encode() for p in parts]


def _ndarray_sample(value: Any) -> list[bytes]:
    size = value.size  # .flat slices copy only the sampled elements
    ends = [value.flat[:_SAMPLE], value.flat[max(size - _SAMPLE, _SAMPLE) :]]
    return [str(value.shape).encode(), str(value.dtype).encode(), *(e.tobytes() for e in ends)]


def _tensor_sample(value: Any) -> list[bytes]:
    flat = value.detach().flatten()
    count = int(flat.shape[0])
    ends = [flat] if count <= 2 * _SAMPLE else [flat[:_SAMPLE], flat[-_SAMPLE:]]
    head = [str(tuple(value.shape)), str(value.dtype), str(value.device)]
    return [h.encode() for h in head] + [e.cpu().numpy().tobytes() for e in ends]


def _mapping_sample(value: Any) -> list[bytes]:
    keys = sorted(value.keys(), key=repr)[: 2 * _SAMPLE]
    return [str(len(value)).encode(), *(repr(k)[:_KEY_REPR_CHARS].encode() for k in keys)]


def _sequence_sample(value: Any) -> list[bytes]:
    # Element identities: replacing an element counts, editing one in place does not.
    items = value if len(value) <= 2 * _SAMPLE else [*value[:_SAMPLE], *value[-_SAMPLE:]]
    return [str(len(value)).encode(), *(str(id(item)).encode() for item in items)]


def _length_sample(value: Any) -> list[bytes]:
    return [str(len(value)).encode()]


def _pickled_sample(value: object) -> list[bytes] | None:
    if isinstance(value, _IMMUTABLE):
        return None  # cannot change in place; identity is enough
    import cloudpickle

    return [cloudpickle.dumps(value, protocol=5)]


def _is_other_container(value: object) -> bool:
    sized = isinstance(value, collections.abc.Sized)
    return sized and not isinstance(value, str | bytes | bytearray)


# First match wins; anything unmatched is digested from its pickle.
_SAMPLERS: tuple[tuple[Callable[[object], bool], Callable[[Any], list[bytes] | None]], ...] = (
    (_is_frame, _pandas_sample),
    (_is_ndarray, _ndarray_sample),
    (_is_tensor, _tensor_sample),
    (lambda v: isinstance(v, collections.abc.Mapping), _mapping_sample),
    (lambda v: isinstance(v, list | tuple), _sequence_sample),
    (_is_other_container, _length_sample),
)


def _digest(value: object) -> str | None:
    sampler = next((s for match, s in _SAMPLERS if match(value)), _pickled_sample)
    try:
        parts = sampler(value)
    except Exception:
        return None  # not sampleable: identity-only tracking
    return None if parts is None else _hashed(parts)


def _hashed(parts: list[bytes]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


def mutation_warnings(
    inputs_before: Mapping[str, object],
    namespace: Mapping[str, object],
    input_names: Iterable[str],
    outputs: Mapping[str, object],
) -> list[MutationWarning]:
    """Advisory ``{"var_name", "message", "suggestion"}`` entries for one finished cell.

    *inputs_before* maps each input name to its ``fingerprint()`` taken before the cell
    ran (in binding order); only names in *input_names* are checked. *outputs* are the
    variables the cell exports, in order. Reported, in this order: inputs deleted from
    *namespace*; inputs changed in place (same object, new digest) and not exported;
    then every pair of outputs that share a mutable object. Pure: nothing is modified.
    """
    checked = set(input_names)
    warnings: list[MutationWarning] = []
    for name, before in inputs_before.items():
        if name not in checked:
            continue
        if name not in namespace:
            warnings.append(_warning(name, f"'{name}' was deleted during execution", None))
        elif name not in outputs and _changed_in_place(namespace[name], before):
            message = (
                f"'{name}' was mutated in place (no reassignment); a downstream cell "
                "will see the pre-mutation value unless this cell exports it"
            )
            warnings.append(_warning(name, message, _MUTATED_HINT))
    warnings.extend(_shared_output_warnings(outputs))
    return warnings


def _warning(name: str, message: str, suggestion: str | None) -> MutationWarning:
    return {"var_name": name, "message": message, "suggestion": suggestion}


def _changed_in_place(value: object, before: object) -> bool:
    if not isinstance(before, InputSnapshot) or before.identity != id(value):
        return False  # rebound (or never fingerprinted): the input object is untouched
    digest = before.digest
    if before.frame is not None:
        if before.frame.unchanged(value):
            return False
        digest = before.frame.digest()
    return digest is not None and _digest(value) != digest


def _children(obj: object) -> Iterable[object]:
    if isinstance(obj, dict):
        return (part for item in obj.items() for part in item)
    if isinstance(obj, list | set | tuple | frozenset):
        return iter(obj)
    attrs = getattr(obj, "__dict__", None)  # never __slots__ descriptors
    return iter(attrs.values()) if isinstance(attrs, dict) else ()


def _is_bulk(obj: object) -> bool:
    """Arrays, tensors and frames: recorded as shared, never walked into."""
    return _is_ndarray(obj) or _is_tensor(obj) or _is_frame(obj)


def _mutable_parts(root: object, max_nodes: int = 20000, max_depth: int = 8) -> dict[int, type]:
    """``id -> type`` of the mutable objects reachable from *root*, depth-first, bounded."""
    found: dict[int, type] = {}
    seen: set[int] = set()
    stack: list[tuple[object, int]] = [(root, 0)]
    while stack and len(seen) < max_nodes:
        obj, depth = stack.pop()
        if id(obj) in seen or depth > max_depth:
            continue
        seen.add(id(obj))
        if isinstance(obj, _IMMUTABLE + _SHARED_BY_NATURE):
            continue
        if not isinstance(obj, tuple | frozenset):  # walked through, never shared state
            found[id(obj)] = type(obj)
            if _is_bulk(obj):
                continue
        try:
            stack.extend((child, depth + 1) for child in _children(obj))
        except Exception:
            continue  # a container that fails to iterate: skip what is below it
    return found


def _shared_output_warnings(outputs: Mapping[str, object]) -> list[MutationWarning]:
    """One warning per pair of outputs that reach the same mutable object."""
    owner: dict[int, str] = {}
    reported: set[frozenset[str]] = set()
    warnings: list[MutationWarning] = []
    for name, value in outputs.items():
        for oid, kind in _mutable_parts(value).items():
            first = owner.setdefault(oid, name)
            pair = frozenset((first, name))
            if first == name or pair in reported:
                continue
            reported.add(pair)
            message = (
                f"outputs '{first}' and '{name}' share a mutable {kind.__name__} object; "
                "stored as separate artifacts they become independent copies downstream"
            )
            warnings.append(_warning(first, message, _SHARED_HINT))
    return warnings
