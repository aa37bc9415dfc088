"""What a request's ``params.environment`` says, checked: :class:`EnvironmentSpec`.

Strata sends ``{"key", "python", "lockfile", "pyproject"}``: the notebook's ``uv.lock`` and
``pyproject.toml`` texts, the lock's key, and the Python minor its ``requires-python`` pins
(``""`` when it pins none). The key is :func:`lock_key` of the lock, so notebooks whose locks
resolve the same packages share one environment whatever their projects are called; a key
that does not match its lock is refused, as Strata's reference worker refuses it, with the
same messages.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass
from typing import Any

from .errors import EnvironmentSpecError

__all__ = ["EnvironmentSpec", "lock_key", "parse_environment"]

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# What stands in for the notebook project's own name in the normalised lock.
_PROJECT = "<project>"
# The project's own entry: these fields name it, so they stay out of the key.
_PROJECT_FIELDS = frozenset({"name", "version", "source", "metadata"})


@dataclass(frozen=True, slots=True)
class EnvironmentSpec:
    """A checked ``params.environment``: ``key`` matches ``lockfile``."""

    key: str  # lock_key(lockfile): 64 lowercase hex digits
    python: str  # a Python request for uv ("3.12"), or "" for whatever uv finds first
    lockfile: str  # the uv.lock text
    pyproject: str  # the pyproject.toml text

    def __repr__(self) -> str:  # the texts are long and the user's
        return f"EnvironmentSpec(key={self.key!r}, python={self.python!r})"


def parse_environment(raw: object) -> EnvironmentSpec | None:
    """The environment *raw* asks for, or None when the request names none.

    Only an absent value (``None``) means "the worker's own environment"; anything else,
    ``{}`` included, must be a complete spec, or :class:`EnvironmentSpecError` says why.
    """
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise EnvironmentSpecError("environment must be an object")
    key = str(raw.get("key") or "")
    if not _SHA256_HEX.fullmatch(key):
        raise EnvironmentSpecError("environment.key must be a sha256 hex digest")
    lockfile, pyproject = raw.get("lockfile"), raw.get("pyproject")
    if not isinstance(lockfile, str) or not isinstance(pyproject, str):
        raise EnvironmentSpecError("environment needs lockfile and pyproject text")
    if lock_key(lockfile) != key:
        raise EnvironmentSpecError("environment.lockfile does not match environment.key")
    python = str(raw.get("python") or "")
    if python.startswith("-"):
        # handed to uv as an argument: it must never read as an option
        raise EnvironmentSpecError("environment.python is not a Python version request")
    return EnvironmentSpec(key=key, python=python, lockfile=lockfile, pyproject=pyproject)


def lock_key(lockfile: str) -> str:
    """SHA-256 of *lockfile* normalised: the notebook project's own entry made anonymous.

    The project's entries (``source`` ``virtual`` or ``editable`` ``"."``) lose their name,
    version, source and metadata, every reference to their name becomes a placeholder, and
    packages and workspace members are sorted, so only the resolved packages and the edges
    that choose what gets installed decide the key.
    """
    try:
        data: dict[str, Any] = tomllib.loads(lockfile)
    except tomllib.TOMLDecodeError as exc:
        raise EnvironmentSpecError(f"environment.lockfile is not TOML: {exc}") from exc
    try:
        canonical = _canonical(data)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise EnvironmentSpecError(f"environment.lockfile is not a uv.lock: {exc!r}") from exc
    return hashlib.sha256(canonical.encode()).hexdigest()


def _canonical(data: dict[str, Any]) -> str:
    packages: list[Any] = data.get("package", [])
    projects = {entry["name"] for entry in packages if _is_project(entry)}
    normalised = []
    for entry in packages:
        if _is_project(entry):
            entry = {field: v for field, v in entry.items() if field not in _PROJECT_FIELDS}
        normalised.append(_anonymised(entry, projects))
    data["package"] = sorted(normalised, key=lambda entry: json.dumps(entry, sort_keys=True))
    manifest = data.get("manifest")
    if isinstance(manifest, dict) and isinstance(manifest.get("members"), list):
        manifest["members"] = sorted(
            _PROJECT if member in projects else member for member in manifest["members"]
        )
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _is_project(entry: Any) -> bool:
    source = entry.get("source") if isinstance(entry, dict) else None
    return isinstance(source, dict) and "." in (source.get("virtual"), source.get("editable"))


def _anonymised(value: Any, projects: set[str]) -> Any:
    """*value* with every ``name`` that names a project replaced by the placeholder."""
    if isinstance(value, list):
        return [_anonymised(item, projects) for item in value]
    if not isinstance(value, dict):
        return value
    return {
        field: _PROJECT
        if field == "name" and isinstance(item, str) and item in projects
        else _anonymised(item, projects)
        for field, item in value.items()
    }
