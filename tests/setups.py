"""Kernel setups for tests: a package written to a folder, shipped into every kernel and
installed there (what a worker does with its agent)."""

from __future__ import annotations

import atexit
import itertools
import shutil
import tempfile
from pathlib import Path

from kernel_pool import KernelSetup, ShippedPackage

_names = itertools.count(1)
_FOLDER = Path(tempfile.mkdtemp(prefix="kernel-setups-"))
atexit.register(shutil.rmtree, _FOLDER, ignore_errors=True)  # made at import: gone at exit


def kernel_setup(
    source: str, *, install: bool = True, modules: dict[str, str] | None = None
) -> KernelSetup:
    """A setup whose one package has ``source`` as its ``__init__.py`` (and ``modules``, file
    name -> source, beside it); with ``install``, the source defines ``install(shell,
    hooks)``, called in every kernel."""
    name = f"test_setup_{next(_names)}"
    folder = _FOLDER / name
    folder.mkdir()
    (folder / "__init__.py").write_text(source, encoding="utf-8")
    for file, text in (modules or {}).items():
        (folder / file).write_text(text, encoding="utf-8")
    package = ShippedPackage(name, folder)
    return KernelSetup(packages=(package,), install=f"{name}:install" if install else None)
