"""What kernels see of the worker's environment: all of it, or an allowlisted part.

By default kernels start with the worker's environment minus its secrets (auth.py). With
``STRATA_NOTEBOOK_HARNESS_ENV_ALLOWLIST`` set (a comma list, or a JSON array), as on a
Strata server or the reference worker, they get only:

- the floor any process needs: ``PATH``, ``HOME``, ``LANG``, ``USER``, the temp-dir names
  and a few more, plus names under ``LC_``, ``PYTHON``, ``VIRTUAL_ENV``, ``UV_``, ``R_`` and
  ``RSTUDIO_``, except those that look like credentials (``KEY``, ``SECRET``, ``TOKEN``,
  ``PASSWORD``, ``CREDENTIAL`` in the name) and uv's index logins and publish settings;
- the listed names: exact names, or prefixes written ``NAME_*``. A prefix never matches a
  ``STRATA_*`` name (those hold tokens and headers); such a name passes only when listed
  exactly.

A request's ``env`` is applied in the kernel for its cell either way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

__all__ = ["ALLOWLIST_ENV_VAR", "kernel_environment", "parse_allowlist"]

ALLOWLIST_ENV_VAR = "STRATA_NOTEBOOK_HARNESS_ENV_ALLOWLIST"

_FLOOR_NAMES = frozenset(
    ("PATH", "HOME", "LANG", "LOGNAME", "USER", "SHELL", "TMPDIR", "TEMP", "TMP", "PWD", "TZ")
)
_FLOOR_PREFIXES = ("LC_", "PYTHON", "VIRTUAL_ENV", "UV_", "R_", "RSTUDIO_")
_CREDENTIAL_WORDS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "CREDENTIAL")
_UV_INDEX_NAMES = frozenset(("UV_INDEX", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX"))
_NEVER_BY_PREFIX = "STRATA_"


def parse_allowlist(raw: str) -> tuple[str, ...]:
    """The names in ``raw``: a JSON array of strings, or a comma list; blank → ``()``.

    Raises:
        ValueError: ``raw`` starts like a JSON array but is not one of strings.
    """
    text = raw.strip()
    if not text.startswith("["):
        return tuple(entry.strip() for entry in text.split(",") if entry.strip())
    try:
        entries = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{ALLOWLIST_ENV_VAR} is not a JSON array: {exc}") from None
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise ValueError(f"{ALLOWLIST_ENV_VAR} must be a JSON array of names")
    return tuple(entry.strip() for entry in entries if entry.strip())


def kernel_environment(environ: Mapping[str, str], allowlist: tuple[str, ...]) -> dict[str, str]:
    """The variables of ``environ`` a kernel starts with (all of them without an allowlist)."""
    if not allowlist:
        return dict(environ)
    return {name: value for name, value in environ.items() if _allowed(name, allowlist)}


def _allowed(name: str, allowlist: tuple[str, ...]) -> bool:
    if _in_floor(name):
        return True
    for entry in allowlist:
        if entry.endswith("*"):
            if name.startswith(entry[:-1]) and not name.startswith(_NEVER_BY_PREFIX):
                return True
        elif name == entry:
            return True
    return False


def _in_floor(name: str) -> bool:
    if name in _FLOOR_NAMES:
        return True
    if not name.startswith(_FLOOR_PREFIXES):
        return False
    upper = name.upper()
    if any(word in upper for word in _CREDENTIAL_WORDS):
        return False
    # uv's index logins and publish settings are for installing, not for cells
    if name.startswith("UV_PUBLISH_") or name in _UV_INDEX_NAMES:
        return False
    return not (name.startswith("UV_INDEX_") and name.endswith(("_USERNAME", "_URL")))
