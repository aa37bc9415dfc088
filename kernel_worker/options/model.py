"""What one option is: its flag, environment variable, parser, help and reference text."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..settings import Settings

__all__ = ["Option", "Setting", "settings_default"]

_FIELDS = {field.name: field for field in dataclasses.fields(Settings)}


@dataclass(frozen=True, slots=True)
class Option:
    """A flag of ``strata-kernel-worker``, also settable by ``env``; flags win.

    ``help`` is the one line ``--help`` prints (:attr:`help_line` adds the default);
    ``details`` (Markdown) is what the configuration reference says of it.
    """

    flag: str
    env: str
    parse: Callable[[str], Any]
    help: str
    details: str
    default: str | None = None
    """What the reference says of the default where no value says it ("ipykernel of this
    Python", "none"); ``None``: the default of the :class:`Settings` field it sets, written
    there only and shown by :attr:`shown_default` and :attr:`help_line`."""
    setting: str | None = None
    """The :class:`Settings` field it sets, where that is not named like the flag."""

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def field(self) -> str:
        """The :class:`Settings` field the option sets."""
        return self.setting or self.dest

    @property
    def shown_default(self) -> str:
        """The reference's "Default" cell."""
        if self.default is not None:
            return self.default
        return f"`{_shown(settings_default(self.field))}`"

    @property
    def help_line(self) -> str:
        """``help``, with the default when it comes from the settings."""
        if self.default is not None:
            return self.help
        return f"{self.help} (default {_shown(settings_default(self.field))})"


def settings_default(name: str) -> Any:
    """The default of the :class:`Settings` field ``name``."""
    field = _FIELDS[name]
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    raise ValueError(f"the setting {name} has no default")


def _shown(value: object) -> str:
    """A default as ``--help`` and the reference write it: ``on``, ``2``, ``16M``."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"{value >> 20}M"
    return str(value)


@dataclass(frozen=True, slots=True)
class Setting:
    """A value read only from the environment (a secret, or a name Strata shares)."""

    names: tuple[str, ...]
    """Its environment variables (several that go together share one entry)."""
    default: str
    details: str
