"""Mount specs: a request's ``mounts`` list checked and parsed, before admission.

A spec names an identifier, a remote URI (``s3://``, ``gs://``/``gcs://``, ``az://``/
``azure://``; never ``file://``), a mode (``ro``/``rw``), fsspec options (only those
:mod:`kernel_worker.mounts.options` allows: never an endpoint or a credential) and a
credential name. :func:`parse_mounts` refuses a bad one with a :class:`BadRequest` naming
the mount, including one whose fsspec backend is not installed on this worker. Details
echo at most 200 characters of what the caller sent and never a secret.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal
from urllib.parse import urlparse

from kernel_worker.errors import BadRequest
from kernel_worker.mounts.options import check_options

__all__ = [
    "Location",
    "MountSpec",
    "echo",
    "locate",
    "missing_backend",
    "parse_mounts",
    "parse_spec",
]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SCHEMES = {"s3": "s3", "gs": "gs", "gcs": "gs", "az": "az", "azure": "az"}
_PROTOCOLS = {"s3": "s3", "gs": "gcs", "az": "abfs"}  # fsspec's names
_BACKENDS = {"s3": "s3fs", "gs": "gcsfs", "az": "adlfs"}
_MAX_ECHO = 200


@dataclass(frozen=True, slots=True)
class MountSpec:
    """One mount as the request declared it (the reference's ``MountSpec``)."""

    name: str
    uri: str
    mode: Literal["ro", "rw"]
    pin: str | None
    options: Mapping[str, object]
    credential: str | None


@dataclass(frozen=True, slots=True)
class Location:
    scheme: str  # s3, gs, az
    path: str  # bucket/prefix, no trailing slash

    @property
    def protocol(self) -> str:
        return _PROTOCOLS[self.scheme]

    @property
    def uri(self) -> str:
        return echo(f"{self.scheme}://{self.path}")


def parse_mounts(raw: Sequence[Mapping[str, object]]) -> tuple[MountSpec, ...]:
    """Validate a request's ``mounts`` list: shapes, then schemes, names, backends.

    Raises:
        BadRequest: Naming the mount and what is wrong with it.
    """
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
        raise BadRequest("mounts must be a list")
    specs = tuple(parse_spec(index, item) for index, item in enumerate(raw))
    locations = [locate(spec) for spec in specs]
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise BadRequest(f"Mount name '{spec.name}' is used more than once")
        seen.add(spec.name)
    for spec, location in zip(specs, locations, strict=True):
        check_options(spec.name, location.scheme, spec.options)
        _require_backend(spec, location)
    return specs


def parse_spec(index: int, item: object) -> MountSpec:
    """One MountSpec's shape (the reference's pydantic model; extra keys ignored)."""
    if not isinstance(item, Mapping):
        raise BadRequest(f"mount {index} must be an object")
    name = item.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise BadRequest(f"mount {index} needs a name that is an identifier")
    uri = item.get("uri")
    if not isinstance(uri, str) or not uri:
        raise BadRequest(f"Mount '{name}' needs a uri")
    mode = item.get("mode", "ro")
    if mode is None:  # null is a field left out (README's one rule)
        mode = "ro"
    if mode != "ro" and mode != "rw":
        raise BadRequest(f"Mount '{name}' mode must be 'ro' or 'rw'")
    options = item.get("options")
    options = {} if options is None else options
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise BadRequest(f"Mount '{name}' options must be an object")
    pin, credential = item.get("pin"), item.get("credential")
    for key, value in (("pin", pin), ("credential", credential)):
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"Mount '{name}' {key} must be a string or null")
    return MountSpec(
        name=name,
        uri=uri,
        mode=mode,
        pin=pin if isinstance(pin, str) else None,
        options=MappingProxyType(dict(options)),
        credential=credential if isinstance(credential, str) else None,
    )


def locate(spec: MountSpec) -> Location:
    """Where a mount points; refuses local, unknown-scheme and bucketless URIs."""
    try:
        parsed = urlparse(spec.uri)
    except ValueError:
        raise BadRequest(f"Mount '{spec.name}' has a malformed uri") from None
    scheme = _SCHEMES.get(parsed.scheme.lower(), parsed.scheme.lower())
    if scheme in ("", "file"):
        raise BadRequest(f"Remote execution does not support file:// mount '{spec.name}'")
    if scheme not in _PROTOCOLS:
        raise BadRequest(
            f"Unsupported mount URI scheme '{echo(scheme)}' for mount '{spec.name}' "
            "(supported: s3, gs, gcs, az, azure)"
        )
    if not parsed.netloc:
        raise BadRequest(f"Mount '{spec.name}' uri names no bucket")
    return Location(scheme, (parsed.netloc + parsed.path).rstrip("/"))


def _require_backend(spec: MountSpec, location: Location) -> None:
    missing = [pkg for pkg in ("fsspec", _BACKENDS[location.scheme]) if not _installed(pkg)]
    if missing:
        raise missing_backend(spec, location, missing)


def missing_backend(spec: MountSpec, location: Location, packages: list[str]) -> BadRequest:
    names = " ".join(packages)
    return BadRequest(
        f"Mount '{spec.name}' ({location.scheme}://) needs the {names} package(s) on "
        f"this worker (pip install {names})"
    )


@functools.cache
def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def echo(text: str) -> str:
    return text if len(text) <= _MAX_ECHO else f"{text[:_MAX_ECHO]}…"
