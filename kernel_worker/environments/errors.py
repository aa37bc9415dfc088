"""The locked-environment exception tree.

::

    LockedEnvironmentError              anything that keeps a cell from its locked environment
    ├── EnvironmentSpecError            the request's ``environment`` is malformed, or its key
    │                                   does not match its lock
    └── EnvironmentBuildError           the environment (or its kernel overlay) could not be
        │                               built, fetched or found on this worker
        └── SourceBuildRefused          the lock needs a package built from source, and this
                                        store refuses source builds (``.packages`` names them)

Each message is written to follow ``"locked environment: "`` in a request's answer, the way
Strata's reference worker words them; the caller adds the prefix and picks the status.
Foreign errors (``subprocess``, ``tarfile``, ``httpx``, ``tomllib``) are translated where they
are raised; nothing above matches on message text.
"""

from __future__ import annotations

__all__ = [
    "EnvironmentBuildError",
    "EnvironmentSpecError",
    "LockedEnvironmentError",
    "SourceBuildRefused",
]


class LockedEnvironmentError(Exception):
    """Root: the cell cannot run in the locked environment it asked for."""


class EnvironmentSpecError(LockedEnvironmentError):
    """The ``environment`` a request carried is malformed or inconsistent."""


class EnvironmentBuildError(LockedEnvironmentError):
    """Building, fetching or checking an environment on this worker failed."""


class SourceBuildRefused(EnvironmentBuildError):
    """The lock holds packages with no wheel, and source builds are off."""

    def __init__(self, message: str, packages: tuple[str, ...]) -> None:
        super().__init__(message)
        self.packages = packages
