"""What the pool's in-kernel code hands to the code a kernel's setup installs.

A pool's :class:`~kernel_pool.KernelSetup` names an install function
(``"package.module:function"``, from a package shipped with it, such as a worker's agent);
:func:`install` calls it as ``function(shell, hooks)``, ``hooks`` being a
:class:`KernelHooks`: the only way in to the pool's in-kernel code. The installed code
declares what it uses of it as a protocol of its own; it never looks the pool's modules up.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from .modules import after_import
from .restore import register_reset_hook


class KernelHooks:
    """The pool's in-kernel services that installed code may use."""

    __slots__ = ()

    def register_reset_hook(self, hook: Callable[[], object]) -> None:
        """Call ``hook()`` at the start of every reset (its exceptions make it unclean)."""
        register_reset_hook(hook)

    def after_import(self, name: str, hook: Callable[[ModuleType], object]) -> None:
        """Call ``hook(module)`` once the module ``name`` is imported (now, if it is)."""
        after_import(name, hook)


def install(shell: Any, target: str | None, pinned: Iterable[str] = ()) -> None:
    """Install the setup's code (``target``, ``"package.module:function"``), then pin the
    environment variables named in ``pinned`` to their values now (the kernel's start
    environment) for every cell, whatever the code installed sets before a cell runs."""
    if target:
        module, _, function = target.partition(":")
        getattr(importlib.import_module(module), function)(shell, KernelHooks())
    kept = {name: os.environ[name] for name in pinned if name in os.environ}
    if kept:
        # registered after the installed code's hooks, so it runs after theirs
        shell.events.register("pre_run_cell", _pinning(kept))


def _pinning(kept: dict[str, str]) -> Callable[..., None]:
    def pin(info: object = None) -> None:
        os.environ.update(kept)

    return pin
