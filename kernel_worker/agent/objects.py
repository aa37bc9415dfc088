"""Python objects stored as pickles: the ``pickle/object`` envelope, ``module/import``
references, and the notebook's own modules (``module/cell``) and instances of their
classes (``module/cell-instance``), written and read back.

The envelope names its codec (cloudpickle, else pickle; ``STRATA_NOTEBOOK_OBJECT_CODEC``
chooses). A ``module/cell`` is rebuilt from its source once per process and tagged, so its
instances can be stored with that source. Stdlib only at import time.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .arrow_codec import removed_on_error
from .content_types import CELL_INSTANCE, MODULE_IMPORT, PICKLE, Metadata, target, written

CODEC_ENV_VAR = "STRATA_NOTEBOOK_OBJECT_CODEC"
_ENVELOPE_KEY = "__strata_object_codec__"
_ENVELOPE_TAG = "strata.notebook.object_codec.v1"
_STATE_KEY = "__strata_cell_instance_state__"
_STATE_TAG = "strata.notebook.cell_instance_state.v1"
_MODULE_SOURCE_ATTR = "__strata_cell_module_source__"
_MODULE_FLAG_ATTR = "__strata_cell_module__"
_EXPORTED_CLASS_ATTR = "__strata_cell_exported_class__"


# --- The codec (pickle envelope) -----------------------------------------------------


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


def is_cell_instance(value: object) -> bool:
    """Whether *value* is an instance of a class a ``module/cell`` defined (not the class)."""
    if isinstance(value, type) or not getattr(type(value), _EXPORTED_CLASS_ATTR, False):
        return False
    source = getattr(sys.modules.get(type(value).__module__), _MODULE_SOURCE_ATTR, None)
    return isinstance(source, str) and bool(source)


# --- Writers --------------------------------------------------------------------------


def write_module(value: object, stem: Path) -> Metadata:
    module_name = getattr(value, "__name__", stem.name)
    path = target(stem, MODULE_IMPORT)
    with removed_on_error(path), open(path, "w", encoding="utf-8") as f:
        json.dump({"module_name": module_name}, f)
    return written(MODULE_IMPORT, path, preview=f"<module '{module_name}'>")


def write_pickle(value: object, stem: Path) -> Metadata:
    codec = _codec_name()
    envelope = {_ENVELOPE_KEY: _ENVELOPE_TAG, "codec": codec, "payload": _dumps(codec, value)}
    path = target(stem, PICKLE)
    with removed_on_error(path), open(path, "wb") as f:
        pickle.dump(envelope, f, protocol=5)
    kind = type(value).__name__
    return written(PICKLE, path, codec=codec, type=kind, preview=f"<{kind} object>")


def write_cell_instance(value: object, stem: Path) -> Metadata:
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
    path = target(stem, CELL_INSTANCE)
    with removed_on_error(path), open(path, "wb") as f:
        pickle.dump(record, f, protocol=5)
    kind = cls.__name__
    return written(CELL_INSTANCE, path, codec=codec, type=kind, preview=f"<{kind} object>")


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


# --- Readers --------------------------------------------------------------------------


def load_pickle(path: Path) -> object:
    with open(path, "rb") as f:
        stored = pickle.load(f)
    if not isinstance(stored, dict) or stored.get(_ENVELOPE_KEY) != _ENVELOPE_TAG:
        return stored  # an older artifact: the pickle is the value itself
    codec, payload = stored.get("codec"), stored.get("payload")
    if not isinstance(codec, str) or not isinstance(payload, bytes):
        raise ValueError("Malformed object codec envelope: needs a str codec and bytes payload")
    return _loads(codec, payload)


def load_module(path: Path) -> object:
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


def load_cell_module(path: Path, injected: Mapping[str, object] | None) -> object:
    with open(path, encoding="utf-8") as f:
        descriptor = json.load(f)
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


def load_cell_instance(path: Path) -> object:
    with open(path, "rb") as f:
        record = pickle.load(f)
    if not isinstance(record, dict):
        raise ValueError("A module/cell-instance file must hold a dict")
    name, class_name, source = (record.get(k) for k in ("module_name", "class_name", "source"))
    if not isinstance(name, str) or not isinstance(class_name, str):
        raise ValueError("A module/cell-instance record needs string module_name and class_name")
    if not isinstance(source, str):
        raise ValueError(f"The stored {class_name} instance has no module source text")
    cls: Any = getattr(_cell_module(name, source, path, None), class_name, None)
    if not isinstance(cls, type):
        raise ValueError(f"Notebook module {name!r} does not define class {class_name!r}")
    if "state_payload" in record and "state_codec" in record:
        codec, payload = record["state_codec"], record["state_payload"]
        if not isinstance(codec, str) or not isinstance(payload, bytes):
            raise ValueError(f"The stored {class_name} instance has a malformed state")
        state = _loads(codec, payload)
    else:
        state = pickle.loads(record["state_pickle"])  # the first version of the format
    made: Any = cls  # any class a cell defined: its own __new__ makes the instance
    instance = made.__new__(made)
    _restore_state(instance, state, class_name)
    return instance
