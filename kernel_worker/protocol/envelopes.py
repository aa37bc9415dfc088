"""The two push envelopes, parsed once into one :class:`CellRequest`.

``POST /v1/execute`` carries the executor-v1 envelope (``transform.params`` plus a list
of input descriptors); ``POST /v1/notebook-execute`` the older flat one (an ``inputs``
object keyed by variable). Both become the same frozen :class:`CellRequest`, so nothing
after this module knows which route a cell came through.

One rule for every field (README, "What a request may carry"): a field left out or sent
as ``null`` gets its default (:func:`_field`); a field the worker reads must hold its JSON
type, or one of the two conversions the reference makes (a numeric string for
``timeout_seconds``, a number or boolean as an ``env`` value); a field it does not read is
ignored, as by the reference. Every other value is a :class:`~kernel_worker.errors.BadRequest`
whose ``detail`` names the field; where the reference worker has a wording for a failure, it
is used verbatim (spec §3.2, §3.3). Validation is hand-written rather than a pydantic model
because most details are fixed strings that must come out in the reference's order.

File names: an input is staged as its descriptor's ``file`` (or ``<name><ext>``, §5.1),
a plain file name that can never leave the run directory; injected values of
``module/cell`` inputs as ``__inj_<input number, from 1>_<j><ext>`` (§5.3). The prefixes in
:data:`RESERVED_FILE_PREFIXES` belong to the worker, so no request may use them.
"""

from __future__ import annotations

import json
import keyword
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kernel_worker.agent.plan import TableRef
from kernel_worker.environments import EnvironmentSpec, EnvironmentSpecError, parse_environment
from kernel_worker.errors import BadRequest, EnvironmentFailed
from kernel_worker.mounts.specs import MountSpec, parse_mounts

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "FORMAT_EXTENSIONS",
    "INJECTED_FILE_PREFIX",
    "RESERVED_FILE_PREFIXES",
    "STAGED_PART_PREFIX",
    "CellRequest",
    "InjectedSpec",
    "InputSpec",
    "input_extension",
    "parse_execute_v1",
    "parse_notebook_execute",
]

EXECUTOR_PROTOCOL_VERSION = "v1"
NOTEBOOK_PROTOCOL_VERSION = "notebook-cell-v1"
TRANSFORM_REF = "notebook_cell@v1"
DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_FORMAT = "pickle/object"

#: Every input format the worker accepts, with the extension of its default file name.
FORMAT_EXTENSIONS: Mapping[str, str] = MappingProxyType(
    {
        "arrow/ipc": ".arrow",
        "json/object": ".json",
        "pickle/object": ".pickle",
        "module/import": ".module.json",
        "module/cell": ".cell_module.json",
        "module/cell-instance": ".cell_instance.pickle",
        "file/path": ".bin",
        "dir/tar": ".dir.tar",
        "text/markdown": ".bin",  # the reference's default: anything not above is .bin
        "application/x-r-rds": ".bin",
    }
)
#: Staged-but-unbound multipart parts (see :mod:`kernel_worker.http.staging`).
STAGED_PART_PREFIX = "__part_"
#: Injected values of ``module/cell`` inputs.
INJECTED_FILE_PREFIX = "__inj_"
RESERVED_FILE_PREFIXES = (STAGED_PART_PREFIX, INJECTED_FILE_PREFIX)

_MAX_FILE_NAME_BYTES = 255
_MAX_ECHO = 200


@dataclass(frozen=True, slots=True)
class InjectedSpec:
    """A value a ``module/cell`` input's definitions close over (spec §5.3)."""

    name: str
    content_type: str
    file: str  # staged name, ``__inj_<i>_<j><ext>``
    part_names: tuple[str, ...]  # form fields to look the upload up by, in order


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One input variable: where its upload is found and where it is staged."""

    name: str
    content_type: str
    file: str  # a plain file name inside the run's inputs directory
    part_names: tuple[str, ...]  # sent ``file``, then ``name``, then ``name`` + extension
    injected: tuple[InjectedSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class CellRequest:
    """One validated cell execution request, whichever envelope it came in."""

    source: str
    timeout_seconds: float
    inputs: tuple[InputSpec, ...]
    env: Mapping[str, str]
    mounts: tuple[MountSpec, ...]
    mutation_defines: tuple[str, ...]
    build_id: str | None
    tables: Mapping[str, TableRef]
    language: str
    environment: EnvironmentSpec | None = None
    """The notebook's locked environment; ``None``: the worker's own."""


def input_extension(content_type: str) -> str:
    """The default file extension for *content_type* (``.bin`` when unknown)."""
    return FORMAT_EXTENSIONS.get(content_type, ".bin")


def parse_execute_v1(raw: bytes) -> CellRequest:
    """Parse the metadata part of ``POST /v1/execute`` (the executor-v1 envelope).

    Raises:
        BadRequest: The envelope is not valid JSON, names another protocol or
            transform, or any field is malformed.
    """
    metadata = _load_metadata(raw)
    _check_version(
        _field(metadata, "protocol_version", EXECUTOR_PROTOCOL_VERSION), EXECUTOR_PROTOCOL_VERSION
    )
    transform = _object(_field(metadata, "transform", {}), "transform")
    ref = _field(transform, "ref", "")
    if ref != TRANSFORM_REF:
        raise BadRequest(f"Unsupported transform: {_echo(ref)}. Expected: {TRANSFORM_REF}")
    params = _object(_field(transform, "params", {}), "transform.params")
    descriptors = _field(metadata, "inputs", [])
    if not isinstance(descriptors, list):
        raise BadRequest("inputs must be a list")
    inputs = _unique(_v1_input(i, d) for i, d in enumerate(descriptors))
    return _cell_request(params, inputs, metadata.get("build_id"))


def parse_notebook_execute(raw: bytes) -> CellRequest:
    """Parse the metadata part of ``POST /v1/notebook-execute`` (the flat envelope).

    Raises:
        BadRequest: As :func:`parse_execute_v1`; here ``protocol_version`` is required.
    """
    metadata = _load_metadata(raw)
    _check_version(metadata.get("protocol_version"), NOTEBOOK_PROTOCOL_VERSION)
    specs = _field(metadata, "inputs", {})
    if not isinstance(specs, dict):
        raise BadRequest("inputs must be an object")
    inputs = _unique(_flat_input(i, var, spec) for i, (var, spec) in enumerate(specs.items()))
    return _cell_request(metadata, inputs, metadata.get("build_id"))


# ---- the envelope --------------------------------------------------------------------


def _load_metadata(raw: bytes) -> dict[str, object]:
    try:
        metadata = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise BadRequest(f"Invalid metadata: {exc}") from None
    if not isinstance(metadata, dict):
        raise BadRequest(f"Invalid metadata: expected a JSON object, got {_json_type(metadata)}")
    return metadata


def _field(fields: Mapping[str, object], key: str, default: object) -> object:
    """``fields[key]``, or ``default`` when it is left out or ``null``: a JSON writer that
    sends ``null`` for a value it does not have means the same as one that leaves it out."""
    value = fields.get(key)
    return default if value is None else value


def _check_version(version: object, expected: str) -> None:
    if version != expected:
        raise BadRequest(f"Unsupported protocol version: {_echo(version)}. Expected: {expected}")


def _cell_request(
    params: Mapping[str, object], inputs: tuple[InputSpec, ...], build_id: object
) -> CellRequest:
    """Everything but the inputs, from ``transform.params`` or the flat envelope."""
    return CellRequest(
        source=_source(_field(params, "source", "")),
        timeout_seconds=_timeout(params.get("timeout_seconds")),
        inputs=inputs,
        env=_env(params.get("env")),
        mounts=_mounts(params.get("mounts", [])),
        mutation_defines=_mutation_defines(params.get("mutation_defines")),
        build_id=_build_id(build_id),
        tables=_tables(params.get("tables")),
        language=_language(params.get("language")),
        environment=_environment(params.get("environment")),
    )


def _environment(value: object) -> EnvironmentSpec | None:
    """The locked environment asked for; a malformed one is the reference's 500."""
    try:
        return parse_environment(value)
    except EnvironmentSpecError as exc:
        raise EnvironmentFailed(str(exc)) from None


def _source(value: object) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"source must be a string, not {_json_type(value)}")
    if not _utf8(value):
        raise BadRequest("source is not valid Unicode text (it holds a lone surrogate)")
    return value


def _timeout(value: object) -> float:
    """``timeout_seconds``: a number of seconds above 0 (or a numeric string, which the
    reference reads with ``float()``). 0 or less is a limit no cell can meet: the reference
    answers it 408 without running the cell, here it is refused up front."""
    if value is None:
        return DEFAULT_TIMEOUT_SECONDS
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise BadRequest(f"timeout_seconds must be a number, not {_json_type(value)}")
    try:
        seconds = float(value)
    except (ValueError, OverflowError):
        raise BadRequest(f"timeout_seconds must be a number, not {_echo(value)!r}") from None
    if not math.isfinite(seconds):
        raise BadRequest(f"timeout_seconds must be finite, not {seconds}")
    if seconds <= 0:
        raise BadRequest(f"timeout_seconds must be greater than 0, not {seconds:g}")
    return seconds


def _env(value: object) -> Mapping[str, str]:
    """``{name: text}``. A number or boolean is written as the reference's harness writes
    every value (``str()``: ``4`` is ``"4"``, ``true`` is ``"True"``); ``null``, a list or
    an object is refused, where the reference would set the text ``"None"`` or ``"[1]"``."""
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, dict):
        raise BadRequest(f"env must be an object, not {_json_type(value)}")
    env: dict[str, str] = {}
    for key, raw in value.items():
        if not key or "=" in key or "\x00" in key or not _utf8(key):
            raise BadRequest(f"env name {_echo(key)!r} is not a valid variable name")
        if isinstance(raw, bool | int | float):
            raw = str(raw)
        if not isinstance(raw, str):
            raise BadRequest(
                f"env value of {_echo(key)} must be a string, a number or a boolean, "
                f"not {_json_type(raw)}"
            )
        if "\x00" in raw or not _utf8(raw):
            raise BadRequest(f"env value of {_echo(key)} holds a NUL or a lone surrogate")
        env[key] = raw
    return MappingProxyType(env)


def _mutation_defines(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise BadRequest("mutation_defines must be a list of strings")
    return tuple(value)


def _tables(value: object) -> Mapping[str, TableRef]:
    """``{name: {"uri": str, "snapshot_id": int | null}}`` (spec §6.1)."""
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, dict):
        raise BadRequest(f"tables must be an object, not {_json_type(value)}")
    tables: dict[str, TableRef] = {}
    for name, table in value.items():
        _check_identifier(name, f"Table name '{_echo(name)}'")
        if not isinstance(table, dict) or not isinstance(table.get("uri"), str):
            raise BadRequest(f"Table '{_echo(name)}' must be an object with a string uri")
        snapshot = table.get("snapshot_id")
        if snapshot is not None and (isinstance(snapshot, bool) or not isinstance(snapshot, int)):
            raise BadRequest(
                f"The snapshot_id of table '{_echo(name)}' must be an integer or null, "
                f"not {_json_type(snapshot)}"
            )
        tables[name] = TableRef(uri=table["uri"], snapshot_id=snapshot)
    return MappingProxyType(tables)


def _language(value: object) -> str:
    """``python`` (or empty, the reference's default) or ``r``; no other language runs here
    (whether R can run on this worker is the service's to say)."""
    if value is None or value == "":
        return "python"
    if not isinstance(value, str):
        raise BadRequest(f"language must be a string, not {_json_type(value)}")
    if value not in ("python", "r"):
        raise BadRequest(f"unsupported cell language {_echo(value)!r}")
    return value


def _build_id(value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise BadRequest(f"build_id must be a string, not {_json_type(value)}")
    return value


# ---- mounts --------------------------------------------------------------------------


def _mounts(value: object) -> tuple[MountSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadRequest("mounts must be a list")
    return parse_mounts(value)


# ---- inputs --------------------------------------------------------------------------


def _v1_input(index: int, descriptor: object) -> InputSpec:
    """One ``inputs[]`` descriptor: ``{name, format?, file?, injected?}``."""
    if not isinstance(descriptor, dict):
        raise BadRequest("input descriptor must be an object")
    name = _field(descriptor, "name", "")
    if not isinstance(name, str):
        raise BadRequest(f"input descriptor name must be a string, not {_json_type(name)}")
    name = name.strip()
    if not name:
        raise BadRequest("input descriptor missing name")
    return _input(
        index,
        name,
        _field(descriptor, "format", DEFAULT_FORMAT),
        descriptor.get("file"),
        descriptor.get("injected"),
    )


def _flat_input(index: int, var: str, spec: object) -> InputSpec:
    """One ``inputs`` entry of the flat envelope: ``{content_type?, file?, injected?}``."""
    if not isinstance(spec, dict):
        raise BadRequest(f"Input spec for {_echo(var)} must be an object")
    return _input(
        index,
        var,
        _field(spec, "content_type", DEFAULT_FORMAT),
        spec.get("file"),
        spec.get("injected"),
    )


def _input(
    index: int, name: str, content_type: object, sent_file: object, injected: object
) -> InputSpec:
    _check_identifier(name, f"Input name {_echo(name)!r}")
    content_type = _format(content_type, f"input '{name}'")
    ext = input_extension(content_type)
    sent = _sent_file(sent_file, f"input '{name}'")
    # only the last component of a path counts, as in the reference ("a/b.json" is b.json)
    file = _plain_file_name(sent.strip().rsplit("/", 1)[-1] if sent else f"{name}{ext}", sent)
    return InputSpec(
        name=name,
        content_type=content_type,
        file=file,
        part_names=_dedup((sent, name, f"{name}{ext}", file)),
        injected=_injected(index, name, content_type, injected),
    )


def _injected(index: int, owner: str, content_type: str, raw: object) -> tuple[InjectedSpec, ...]:
    if raw is None or raw == {}:
        return ()
    if content_type != "module/cell":
        raise BadRequest(
            f"Input '{owner}' carries injected values, but only module/cell inputs take them"
        )
    if not isinstance(raw, dict):
        raise BadRequest(f"injected of input '{owner}' must be an object")
    return tuple(_injected_one(index, j, owner, n, s) for j, (n, s) in enumerate(raw.items()))


def _injected_one(index: int, j: int, owner: str, name: str, spec: object) -> InjectedSpec:
    where = f"injected value '{_echo(name)}' of input '{owner}'"
    if not isinstance(spec, dict):
        raise BadRequest(f"The {where} must be an object")
    _check_identifier(name, f"The name of the {where}")
    content_type = _format(_field(spec, "content_type", DEFAULT_FORMAT), where)
    ext = input_extension(content_type)
    sent = _sent_file(spec.get("file"), where)
    return InjectedSpec(
        name=name,
        content_type=content_type,
        # The request's file name is only a lookup key; the staged name is ours. Inputs
        # count from 1 there, as the reference's staged names do.
        file=f"{INJECTED_FILE_PREFIX}{index + 1}_{j}{ext}",
        part_names=_dedup((sent, name, f"{name}{ext}")),
    )


def _format(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"The format of {where} must be a string, not {_json_type(value)}")
    if value not in FORMAT_EXTENSIONS:
        known = ", ".join(sorted(FORMAT_EXTENSIONS))
        raise BadRequest(f"Unsupported format {_echo(value)!r} for {where}. Known: {known}")
    return value


def _sent_file(value: object, where: str) -> str | None:
    """The ``file`` as sent, or None when absent or blank (the reference's default)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"The file of {where} must be a string, not {_json_type(value)}")
    return value if value.strip() else None


def _plain_file_name(file: str, sent: str | None = None) -> str:
    if file in ("", ".", "..") or any(c in file for c in "/\\\x00") or not _utf8(file):
        shown = sent.strip() if sent else file
        raise BadRequest(f"Input file name {_echo(shown)!r} is not a plain file name")
    if len(file.encode("utf-8")) > _MAX_FILE_NAME_BYTES:
        raise BadRequest(f"Input file name {_echo(file)!r} is longer than 255 bytes")
    if file.startswith(RESERVED_FILE_PREFIXES):
        raise BadRequest(
            f"Input file name {_echo(file)!r} starts with a prefix reserved for the worker"
        )
    return file


def _unique(specs: Iterable[InputSpec]) -> tuple[InputSpec, ...]:
    """The inputs in order, refusing two with one name or one file name."""
    inputs = tuple(specs)
    names: set[str] = set()
    files: set[str] = set()
    for spec in inputs:
        if spec.name in names:
            raise BadRequest(f"Duplicate input name '{spec.name}'")
        if spec.file in files:
            raise BadRequest(f"Duplicate input file name {spec.file!r}")
        names.add(spec.name)
        files.add(spec.file)
    return inputs


# ---- small helpers -------------------------------------------------------------------


def _object(value: object, what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be an object, not {_json_type(value)}")
    return value


def _check_identifier(name: str, what: str) -> None:
    if not name.isidentifier() or keyword.iskeyword(name):
        raise BadRequest(f"{what} is not a Python identifier")


def _dedup(names: Iterable[str | None]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for name in names if name))


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _echo(value: object) -> str:
    """A request value quoted back in a detail, cut short when huge."""
    text = str(value)
    return text if len(text) <= _MAX_ECHO else f"{text[:_MAX_ECHO]}…"


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)
