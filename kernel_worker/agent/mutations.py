"""Advisory warnings about a cell's inputs and outputs: inputs changed in place or
deleted, and outputs that share a mutable object (stored apart, they stop being shared).

``fingerprint`` snapshots each input before the cell; ``mutation_warnings`` compares after
it. Stdlib only at import time; pandas, numpy and torch values are recognised without
importing them.
"""

from __future__ import annotations

import collections.abc
import hashlib
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from . import arrow_codec

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
