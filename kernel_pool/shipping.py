"""Shipping packages into kernels, and what a kernel runs at start.

A kernel may run another interpreter, in another environment, where neither the pool nor
its user is installed. A :class:`ShippedPackage` is a folder of stdlib-only modules that the
pool sends to such a kernel as sources; there :mod:`kernel_pool._finder` makes it a real
package under its own name (its modules import one another, relative imports included).
The pool's own in-kernel code (:data:`INKERNEL`) is shipped this way, and so is whatever a
:class:`KernelSetup` names (a worker's agent). The code is idempotent: the fork server runs
it once, and a kernel forked from it starts with every package loaded.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["INKERNEL", "NO_SETUP", "KernelSetup", "ShippedPackage", "load_code"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
_FINDER_MODULE = "kernel_pool_shipping"


@dataclass(frozen=True, slots=True)
class ShippedPackage:
    """A package sent to kernels as its modules' sources."""

    name: str
    """The top-level name it is imported as in a kernel."""
    source: Path
    """The folder of its modules (``__init__.py`` and the rest, sub-packages included)."""

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"a shipped package needs a top-level module name: {self.name!r}")

    def sources(self) -> dict[str, str]:
        """Each module's path relative to :attr:`source` (``/`` between folders) -> its
        source, the package's ``__init__.py`` first."""
        files = sorted(self.source.rglob("*.py"), key=lambda p: (p.name != "__init__.py", p.parts))
        return {
            path.relative_to(self.source).as_posix(): path.read_text(encoding="utf-8")
            for path in files
            if "__pycache__" not in path.parts
        }


INKERNEL = ShippedPackage("kernel_pool_inkernel", Path(__file__).with_name("inkernel"))
"""The pool's own code that runs in every kernel (:mod:`kernel_pool.inkernel`)."""


@dataclass(frozen=True, slots=True)
class KernelSetup:
    """What every kernel runs at start, before the preload: packages to ship, and the
    function that installs them.

    The fork server loads the packages once (forked kernels start with them); a spawned
    kernel loads them at start. ``install`` (``"package.module:function"``) is then called
    in each kernel as ``function(shell, hooks)``: ``shell`` the kernel's IPython shell,
    ``hooks`` the pool's :class:`kernel_pool.inkernel.KernelHooks`. The packages' modules
    are imported in the fork server too: at import they may start no thread, event loop or
    connection (the standard library only, as the pool's own).
    """

    packages: tuple[ShippedPackage, ...] = ()
    install: str | None = None

    def __post_init__(self) -> None:
        if self.install is not None and not _TARGET.fullmatch(self.install):
            raise ValueError(f"install must read 'package.module:function': {self.install!r}")
        names = [package.name for package in self.packages]
        if INKERNEL.name in names or len(set(names)) != len(names):
            raise ValueError("shipped packages need names of their own")


NO_SETUP = KernelSetup()
"""Kernels start with the pool's own in-kernel code only."""


@functools.cache
def load_code(packages: tuple[ShippedPackage, ...]) -> str:
    """Kernel source that loads ``packages`` (where not loaded yet) from their sources.

    Data only: the sources travel as string literals; nothing of a request is in it.
    """
    finder = Path(__file__).with_name("_finder.py").read_text(encoding="utf-8")
    sources = {package.name: package.sources() for package in packages}
    return (
        "def __kernel_pool_ship(finder, packages):\n"
        "    import sys, types\n"
        f"    module = sys.modules.get({_FINDER_MODULE!r})\n"
        "    if module is None:\n"
        f"        module = types.ModuleType({_FINDER_MODULE!r})\n"
        f"        sys.modules[{_FINDER_MODULE!r}] = module\n"
        f"        exec(compile(finder, '<{_FINDER_MODULE}>', 'exec'), module.__dict__)\n"
        "    module.load(packages)\n"
        f"__kernel_pool_ship({finder!r}, {sources!r})\n"
        "del __kernel_pool_ship\n"
    )
