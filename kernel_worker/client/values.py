"""The values :mod:`kernel_worker.client.session` sends and gets back: inputs encoded with the
worker's own codecs into multipart parts, and a bundle read into a :class:`CellResult`
(outputs decoded only when read, displays in every format they came in)."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import keyword
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, cast

from .errors import CellError, InputEncodingError, OutputDecodingError, ProtocolError

__all__ = [
    "CellResult",
    "Display",
    "EncodedInput",
    "Outputs",
]

# A display's richest format first: what ``Display.content_type`` picks.
_PREFERENCE = (
    "image/png",
    "image/jpeg",
    "image/svg+xml",
    "text/html",
    "text/markdown",
    "text/latex",
    "application/json",
    "text/plain",
)


# ---- values in: inputs ---------------------------------------------------------------


class _Codecs(Protocol):
    """The typed view of :mod:`kernel_worker.agent.codecs` this module relies on.

    The codecs also run inside kernels and are not type-checked with the package, so they
    are imported by name and seen through this protocol.
    """

    def serialize(self, name: str, value: object, out_dir: str) -> dict[str, object]: ...
    def load_input(self, path: str, content_type: str) -> object: ...
    def file_stem(self, name: str) -> str: ...
    def extension_for(self, content_type: str) -> str: ...


def _codecs() -> _Codecs:
    return cast(_Codecs, importlib.import_module("kernel_worker.agent.codecs"))


@dataclass(frozen=True, slots=True)
class EncodedInput:
    """A value already encoded in one of the protocol's formats; sent as it is.

    ``content_type`` is the input format (``arrow/ipc``, ``json/object``, ``pickle/object``,
    ``file/path`` …). ``file_name`` is the name it is staged under on the worker (what a
    ``file/path`` input's cell sees); it defaults to the input's name plus the format's
    extension, as Strata names them.
    """

    content_type: str
    data: bytes
    file_name: str | None = None


@dataclass(frozen=True, slots=True)
class InputPart:
    descriptor: dict[str, object]
    file_name: str
    data: bytes


def encode_inputs(inputs: Mapping[str, object]) -> list[InputPart]:
    """Each input as an envelope descriptor plus the bytes of its multipart file part."""
    codecs = _codecs()
    parts: list[InputPart] = []
    with tempfile.TemporaryDirectory(prefix="skw-client-") as tmp:
        for name, value in inputs.items():
            if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
                raise InputEncodingError(f"input name {name!r} is not a Python identifier")
            if isinstance(value, EncodedInput):
                ext = codecs.extension_for(value.content_type)
                file_name = value.file_name or codecs.file_stem(name) + ext
                parts.append(_part(name, value.content_type, file_name, value.data))
                continue
            meta = codecs.serialize(name, value, tmp)
            if "error" in meta:
                raise InputEncodingError(
                    f"input {name!r} ({type(value).__name__}) cannot be encoded: {meta['error']}"
                )
            file_name = str(meta["file"])
            data = Path(tmp, file_name).read_bytes()
            parts.append(_part(name, str(meta["content_type"]), file_name, data))
    return parts


def _part(name: str, content_type: str, file_name: str, data: bytes) -> InputPart:
    descriptor: dict[str, object] = {
        "name": name,
        "format": content_type,
        "file": file_name,
        "byte_size": len(data),
    }
    return InputPart(descriptor, file_name, data)


# ---- values out: the bundle ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Display:
    """One display output of the cell (a figure, a table, markdown …) in every format it came in.

    ``formats`` maps content types to data: ``bytes`` for binary formats (``image/png``),
    ``str`` for text ones (``text/html``, ``text/markdown``, ``image/svg+xml``,
    ``text/plain``). ``content_type``/``data`` are the richest of them. In Jupyter a
    ``Display`` renders as itself.
    """

    formats: Mapping[str, bytes | str]
    output_type: str = "display_data"

    @property
    def content_type(self) -> str:
        ranked = [t for t in _PREFERENCE if t in self.formats]
        return ranked[0] if ranked else next(iter(self.formats))

    @property
    def data(self) -> bytes | str:
        return self.formats[self.content_type]

    def __repr__(self) -> str:
        """Binary formats by their size: a PNG's bytes are no use on a console."""
        shown = ", ".join(
            f"{kind!r}: <{len(value)} bytes>" if isinstance(value, bytes) else
            f"{kind!r}: {value[:80]!r}" + ("…" if len(value) > 80 else "")
            for kind, value in self.formats.items()
        )  # fmt: skip
        return f"Display({{{shown}}}, output_type={self.output_type!r})"

    def _repr_mimebundle_(
        self, include: object = None, exclude: object = None
    ) -> dict[str, object]:
        import base64

        bundle: dict[str, object] = {}
        for kind, value in self.formats.items():
            if isinstance(value, bytes):
                bundle[kind] = base64.b64encode(value).decode("ascii")
            elif kind == "application/json" or kind.endswith("+json"):
                with contextlib.suppress(ValueError):
                    bundle[kind] = json.loads(value)
            else:
                bundle[kind] = value
        return bundle


def _is_text(content_type: str) -> bool:
    return content_type.startswith("text/") or content_type in (
        "image/svg+xml",
        "application/json",
        "application/javascript",
    )


def _as_format(content_type: str, raw: bytes) -> bytes | str:
    return raw.decode("utf-8", "replace") if _is_text(content_type) else raw


class Outputs(Mapping[str, object]):
    """The cell's outputs by name, decoded on first access (then kept).

    Iterating lists every variable the cell made; reading one the worker could not serialize,
    or one that cannot be decoded here, raises :class:`OutputDecodingError`.
    """

    def __init__(
        self, variables: Mapping[str, Mapping[str, object]], members: Mapping[str, bytes]
    ) -> None:
        self._variables = variables
        self._members = members
        self._decoded: dict[str, object] = {}

    def __getitem__(self, name: str) -> object:
        if name not in self._decoded:
            self._decoded[name] = self._decode(name)
        return self._decoded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._variables)

    def __len__(self) -> int:
        return len(self._variables)

    def encoded(self, name: str) -> EncodedInput:
        """Output *name* as the worker encoded it: ready to send on as another cell's input."""
        meta = self._variables[name]
        if "error" in meta:
            raise OutputDecodingError(f"output {name!r} was not serialized: {meta['error']}")
        member = meta.get("file")
        content_type = meta.get("content_type")
        if not isinstance(member, str) or member not in self._members:
            raise OutputDecodingError(f"output {name!r} has no file in the bundle")
        if not isinstance(content_type, str):
            raise OutputDecodingError(f"output {name!r} has no content type")
        return EncodedInput(content_type, self._members[member])

    def _decode(self, name: str) -> object:
        encoded = self.encoded(name)
        if encoded.content_type in ("image/png", "text/markdown"):
            return _as_format(encoded.content_type, encoded.data)
        with tempfile.TemporaryDirectory(prefix="skw-client-") as tmp:
            path = Path(tmp, "value")
            path.write_bytes(encoded.data)
            try:
                return _codecs().load_input(str(path), encoded.content_type)
            except Exception as exc:  # the codec's or the format reader's own error
                raise OutputDecodingError(
                    f"output {name!r} ({encoded.content_type}) cannot be decoded here: {exc}"
                ) from exc


@dataclass(frozen=True, slots=True, eq=False)
class CellResult:
    """What one cell run produced. A cell that raised is a result too (``success`` false)."""

    success: bool
    stdout: str
    stderr: str
    error: str | None
    error_type: str | None
    traceback: str | None
    #: The manifest's per-variable metadata (content_type, file, preview, rows, …).
    variables: Mapping[str, Mapping[str, object]]
    outputs: Outputs
    displays: tuple[Display, ...]
    mutation_warnings: tuple[Mapping[str, object], ...]
    #: The worker's own timing of the cell; None if the bundle does not say.
    duration_seconds: float | None
    #: From sending the request to holding the whole bundle, as this client saw it.
    round_trip_seconds: float
    manifest: Mapping[str, object] = field(repr=False)
    #: Every file of the bundle by its path in it (what the manifest's ``file`` fields name).
    files: Mapping[str, bytes] = field(default_factory=dict, repr=False)

    def raise_for_error(self) -> CellResult:
        """Raise :class:`CellError` if the cell raised; return the result otherwise."""
        if not self.success:
            raise CellError(self)
        return self


def _read_members(body: bytes) -> dict[str, bytes]:
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
            for info in tar:
                extracted = tar.extractfile(info) if info.isfile() else None
                if extracted is not None:
                    members[info.name] = extracted.read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ProtocolError(f"the answer is not a readable tar bundle: {exc}") from exc
    return members


def _json_member(members: Mapping[str, bytes], name: str) -> dict[str, object] | None:
    if name not in members:
        return None
    try:
        document = json.loads(members[name])
    except ValueError as exc:
        raise ProtocolError(f"{name} in the bundle is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise ProtocolError(f"{name} in the bundle is not a JSON object")
    return document


def parse_bundle(body: bytes, round_trip_seconds: float) -> CellResult:
    """A :class:`CellResult` from the bytes of a bundle. Pure apart from the tar reading."""
    members = _read_members(body)
    manifest = _json_member(members, "manifest.json")
    if manifest is None or not isinstance(manifest.get("success"), bool):
        raise ProtocolError("the bundle has no manifest.json with a boolean 'success'")
    variables = _mapping(manifest.get("variables"))
    error_doc = _json_member(members, "error.json") or {}
    duration_ms = manifest.get("duration_ms")
    return CellResult(
        success=bool(manifest["success"]),
        stdout=_console(members, manifest.get("stdout_file"), "stdout.txt"),
        stderr=_console(members, manifest.get("stderr_file"), "stderr.txt"),
        error=_optional_str(manifest.get("error")),
        error_type=_optional_str(error_doc.get("type")),
        traceback=_optional_str(manifest.get("traceback")),
        variables=variables,
        outputs=Outputs(variables, members),
        displays=_displays(manifest, members),
        mutation_warnings=tuple(
            w for w in _list(manifest.get("mutation_warnings")) if isinstance(w, dict)
        ),
        duration_seconds=duration_ms / 1000 if isinstance(duration_ms, int | float) else None,
        round_trip_seconds=round_trip_seconds,
        manifest=manifest,
        files=members,
    )


def _displays(manifest: Mapping[str, object], members: Mapping[str, bytes]) -> tuple[Display, ...]:
    """Jupyter displays from ``display[]``; else the reference's ``displays`` (PNG, markdown)."""
    formats: dict[int, dict[str, bytes | str]] = {}
    output_types: dict[int, str] = {}
    for entry in _list(manifest.get("display")):
        if not isinstance(entry, dict):
            continue
        file, kind, index = entry.get("file"), entry.get("content_type"), entry.get("index")
        if not (isinstance(file, str) and isinstance(kind, str) and isinstance(index, int)):
            continue
        if file in members:
            output_types.setdefault(index, str(entry.get("output_type") or "display_data"))
            formats.setdefault(index, {})[kind] = _as_format(kind, members[file])
    if formats:
        return tuple(Display(formats[i], output_types[i]) for i in sorted(formats))
    found = (_reference(entry, members) for entry in _list(manifest.get("displays")))
    return tuple(display for display in found if display is not None)


def _reference(entry: object, members: Mapping[str, bytes]) -> Display | None:
    """One display in the reference worker's convention (``files/__display__<i>.<ext>``)."""
    if not isinstance(entry, dict) or not isinstance(kind := entry.get("content_type"), str):
        return None
    if kind == "text/markdown" and isinstance(text := entry.get("markdown_text"), str):
        return Display({kind: text})
    file = entry.get("file")
    if not isinstance(file, str) or file not in members:
        return None
    return Display({kind: _as_format(kind, members[file])})


def _console(members: Mapping[str, bytes], named: object, default: str) -> str:
    member = named if isinstance(named, str) else default
    return members.get(member, b"").decode("utf-8", "replace")


def _mapping(value: object) -> dict[str, Mapping[str, object]]:
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, dict)}


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _optional_str(value: object) -> str | None:
    return value if isinstance(value, str) else None
