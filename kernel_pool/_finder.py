"""The finder that serves shipped packages' modules inside a kernel.

Sent to kernels as source by :mod:`kernel_pool.shipping` and run there as the module
``kernel_pool_shipping`` (standard library only, on every Python the kernels may run): its
:func:`load` makes each shipped package importable from the sources it is given, and imports
it with every module, so the modules import one another as in any installed package
(relative imports included). A package already in ``sys.modules`` (a kernel forked from the
fork server, which loaded it) is left as it is.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from importlib.abc import Loader


class ShippedFinder:
    """A meta path finder and loader for the modules whose sources it was given."""

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}
        self.packages: set[str] = set()

    def add(self, package: str, sources: Mapping[str, str]) -> None:
        """``sources``: each module's file, relative to the package's folder and with ``/``
        between folders (``__init__.py``, ``a.py``, ``sub/__init__.py``) -> its source."""
        for path, source in sources.items():
            parts = [package, *path.removesuffix(".py").split("/")]
            if parts[-1] == "__init__":
                parts.pop()
                self.packages.add(".".join(parts))
            self.sources[".".join(parts)] = source

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name not in self.sources:
            return None
        loader = cast("Loader", self)  # a loader by its methods, not by its base class
        return ModuleSpec(name, loader, origin=f"<{name}>", is_package=name in self.packages)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return None  # the import system's default module

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        # the file name tracebacks and profiles show: "<package.module>"
        exec(compile(self.sources[name], f"<{name}>", "exec"), module.__dict__)


_FINDER = ShippedFinder()


def load(packages: Mapping[str, Mapping[str, str]]) -> None:
    """Make each package importable from its sources and import it with all its modules,
    unless it is loaded already."""
    new = {name: sources for name, sources in packages.items() if name not in sys.modules}
    if not new:
        return
    for name, sources in new.items():
        _FINDER.add(name, sources)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    for name in new:
        importlib.import_module(name)
    for name in sorted(n for n in _FINDER.sources if n.partition(".")[0] in new):
        importlib.import_module(name)
