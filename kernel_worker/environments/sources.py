"""Which packages of a lock would be built from source, and the refusal that names them.

Building a source distribution runs the package's own build code. A store that refuses
source builds runs uv with ``--no-build``; when uv then fails, :func:`refuse_source_builds`
reads the lock to say which packages had no wheel, rather than leaving the user with uv's
output alone.
"""

from __future__ import annotations

import tomllib
from typing import Any

from .errors import SourceBuildRefused

__all__ = ["packages_without_wheels", "refuse_source_builds"]


def packages_without_wheels(lockfile: str) -> tuple[str, ...]:
    """``name==version`` of each package in *lockfile* that only a build can install.

    Those with no wheel at all: an sdist only, or a git, directory or editable source.
    The notebook project itself is never installed, and virtual members install nothing.
    """
    try:
        packages: list[Any] = tomllib.loads(lockfile).get("package", [])
    except tomllib.TOMLDecodeError:
        return ()
    needing = []
    for entry in packages:
        if not isinstance(entry, dict):
            continue
        source = entry.get("source")
        if isinstance(source, dict) and ("virtual" in source or source.get("editable") == "."):
            continue
        if not entry.get("wheels"):
            needing.append(f"{entry.get('name')}=={entry.get('version', '?')}")
    return tuple(sorted(needing))


def refuse_source_builds(lockfile: str, hint: str, cause: BaseException) -> None:
    """Raise :class:`SourceBuildRefused` when *lockfile* holds packages needing a build."""
    needing = packages_without_wheels(lockfile)
    if not needing:
        return
    names = ", ".join(needing)
    raise SourceBuildRefused(
        f"{names} {'has' if len(needing) == 1 else 'have'} no wheel, and building from source "
        f"would run the package's own code on this worker, which refuses source builds "
        f"(allow them with {hint}): {cause}",
        needing,
    ) from cause
