"""Every option of ``strata-kernel-worker``, in one table that ``--help`` and the
configuration reference (``docs/configuration.md``) are both made from.

``serving``, ``kernels`` and ``runs`` hold the flags by what they configure, ``environment``
the settings read only from the environment, ``parsing`` how an option's text becomes its
value. Imports only ``settings``; the command line (``kernel_worker.cli``) builds its parser
from ``GROUPS``.
"""

from __future__ import annotations

from .environment import SETTINGS
from .environments import OPTIONS as ENVIRONMENT_OPTIONS
from .kernels import OPTIONS as KERNEL_OPTIONS
from .languages import OPTIONS as LANGUAGE_OPTIONS
from .model import Option, Setting
from .parsing import ENV_PREFIX
from .runs import OPTIONS as RUN_OPTIONS
from .serving import OPTIONS as SERVING_OPTIONS

__all__ = [
    "ENV_PREFIX",
    "GROUPS",
    "OPTIONS",
    "SETTINGS",
    "Option",
    "Setting",
    "documented_names",
    "reference",
]

GROUPS: tuple[tuple[str, tuple[Option, ...]], ...] = (
    ("Serving", SERVING_OPTIONS),
    ("Kernels", KERNEL_OPTIONS),
    ("Locked environments", ENVIRONMENT_OPTIONS),
    ("R cells", LANGUAGE_OPTIONS),
    ("Runs and their caps", RUN_OPTIONS),
)
OPTIONS: tuple[Option, ...] = tuple(option for _, group in GROUPS for option in group)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference() -> str:
    """The configuration reference's tables, in Markdown (``docs/configuration.md``)."""
    lines: list[str] = []
    for title, group in GROUPS:
        lines += [f"## {title}", "", "| Flag | Environment | Default | Meaning |"]
        lines.append("| --- | --- | --- | --- |")
        for option in group:
            cells = (f"`{option.flag}`", f"`{option.env}`", option.shown_default, option.details)
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
    lines += [
        "## Environment only",
        "",
        "| Environment | Default | Meaning |",
        "| --- | --- | --- |",
    ]
    for setting in SETTINGS:
        names = ", ".join(f"`{name}`" for name in setting.names)
        row = (names, setting.default, setting.details)
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines) + "\n"


def documented_names() -> frozenset[str]:
    """Every environment variable the reference describes."""
    names = {option.env for option in OPTIONS}
    for setting in SETTINGS:
        names.update(setting.names)
    return frozenset(names)
