"""What one option is: its flag, environment variable, parser, help and reference text."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Option", "Setting"]


@dataclass(frozen=True, slots=True)
class Option:
    """A flag of ``strata-kernel-worker``, also settable by ``env``; flags win.

    ``help`` is the one line ``--help`` prints; ``default`` and ``details`` (Markdown) are
    what the configuration reference says of it.
    """

    flag: str
    env: str
    parse: Callable[[str], Any]
    help: str
    default: str
    details: str

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


@dataclass(frozen=True, slots=True)
class Setting:
    """A value read only from the environment (a secret, or a name Strata shares)."""

    names: tuple[str, ...]
    """Its environment variables (several that go together share one entry)."""
    default: str
    details: str
