"""What the agent uses of the kernel it is installed in: the pool's hooks, as a protocol.

The pool's in-kernel code hands an object of this shape to :func:`.runtime.install`; the
agent knows nothing else of the pool (it may not import it: it runs in kernels where the
pool is not installed). Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Protocol

__all__ = ["PoolHooks"]


class PoolHooks(Protocol):
    """The pool's services in a kernel."""

    def register_reset_hook(self, hook: Callable[[], object]) -> None:
        """Call ``hook()`` at the start of every reset of the kernel."""

    def after_import(self, name: str, hook: Callable[[ModuleType], object]) -> None:
        """Call ``hook(module)`` once the module ``name`` is imported (now, if it is)."""
