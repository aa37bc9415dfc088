"""``sys.modules`` after a cell: what stays warm, what is put back, what is removed.

Modules the import system loaded stay imported (that is the point of a warm kernel), and a
module every request has seen stays the one later requests see: an entry a cell deleted or
replaced is put back. An entry the import system did not create (not a module, no spec, or
a spec of another name: ``sys.modules['x'] = types.ModuleType('x')``, a mock put where a
library is imported from) is removed, as a fresh interpreter would not have it, and so are
the modules imported after it in that request (they may hold it). Entries a module puts
there while it is being imported (a compatibility alias, a module replacing itself with a
wrapper) stay, as the module does.
"""

from __future__ import annotations

import itertools
import sys
from types import ModuleType
from typing import Any

from .baseline import MISSING, Snapshot

_table: dict[str, Any] = {}  # "snapshot": sys.modules after the last reset (a Snapshot)
# name -> object a module put in sys.modules during its import
_put_while_importing: dict[str, Any] = {}


def watch_imports() -> None:
    """Note what modules put in ``sys.modules`` while they are imported (call before the
    baseline). The import system looks ``_find_and_load`` up on ``importlib._bootstrap``
    for every import not yet loaded; the wrapper carries that module's file name, so that
    tracebacks of failed imports are trimmed of it as of the import system's own frames."""
    bootstrap: Any = sys.modules.get("importlib._bootstrap")
    original = getattr(bootstrap, "_find_and_load", None)
    if original is None or getattr(original, "_kernel_pool_watched", False):
        return
    namespace = {"_original": original, "_ended": _import_ended, "_depth": [0], "sys": sys}
    exec(compile(_WRAPPER, original.__code__.co_filename, "exec"), namespace)
    wrapper = namespace["_find_and_load"]
    vars(wrapper)["_kernel_pool_watched"] = True
    bootstrap._find_and_load = wrapper


_WRAPPER = """
def _find_and_load(*args, **kwargs):
    depth = _depth
    if depth[0]:
        return _original(*args, **kwargs)
    before = len(sys.modules)
    depth[0] = 1
    try:
        return _original(*args, **kwargs)
    finally:
        depth[0] = 0
        _ended(before)
"""


def _import_ended(before: Any) -> None:
    """Record the entries an import added that the import system did not make itself."""
    modules = sys.modules
    added = len(modules) - before
    if added <= 0:
        return
    for name in list(itertools.islice(reversed(modules), added)):  # newest last
        value = modules.get(name, MISSING)
        if value is not MISSING and not _imported(name, value):
            _put_while_importing[name] = value


def _imported(name: str, value: Any) -> Any:
    """Whether the import system made this entry: a module whose spec has its name."""
    if not isinstance(value, ModuleType):
        return False
    spec = getattr(value, "__spec__", None)
    return spec is not None and getattr(spec, "name", None) == name


def capture_module_table() -> None:
    """Record ``sys.modules`` as the baseline's (with the rest of the baseline)."""
    _table["snapshot"] = Snapshot(sys.modules)


def restore_module_table() -> None:
    """Put back entries a cell deleted or replaced; remove those the import system did not
    make, and the modules imported since that hold one of them."""
    modules = sys.modules
    snapshot = _table["snapshot"]
    if snapshot.unchanged(modules, exact=True):
        return
    stand_ins = []
    if not snapshot.unchanged(modules, exact=False):
        for name, module in snapshot.items.items():
            current = modules.get(name, MISSING)
            if current is not module:
                if current is not MISSING and not _imported(name, current):
                    stand_ins.append(current)
                modules[name] = module
    new = [(name, value) for name, value in list(modules.items()) if name not in snapshot.items]
    gone = [(name, value) for name, value in new if not _kept(name, value)]
    stand_ins += [value for _, value in gone]
    if stand_ins:
        gone += [(n, v) for n, v in new if _kept(n, v) and _holds_any(v, stand_ins)]
        _drop(modules, gone)
    _table["snapshot"] = Snapshot(modules)
    if len(_put_while_importing) > len(modules):  # (names of entries long gone)
        for name in [n for n in list(_put_while_importing) if n not in modules]:
            del _put_while_importing[name]


def _holds_any(module: Any, stand_ins: Any) -> Any:
    """Whether a module imported meanwhile bound a stand-in (``import torch`` under a mock),
    or an object of a stand-in's own class (``from torch import nn``: another mock)."""
    ids = {id(value) for value in stand_ins}
    kinds = {
        type(value)
        for value in stand_ins
        if not isinstance(value, ModuleType) and type(value).__module__ not in ("builtins", "types")
    }
    values = list(getattr(module, "__dict__", {}).values())
    return any(id(value) in ids or type(value) in kinds for value in values)


def _kept(name: str, value: Any) -> Any:
    return _imported(name, value) or _put_while_importing.get(name, MISSING) is value


def _drop(modules: Any, entries: Any) -> None:
    """Remove entries from ``sys.modules``, and each module from its package's attributes
    (where the import system bound it), so that the next import loads it anew."""
    for name, value in entries:
        if modules.get(name, MISSING) is value:
            del modules[name]
        parent, _, child = name.rpartition(".")
        package = modules.get(parent) if parent else None
        attributes = getattr(package, "__dict__", None)
        if isinstance(attributes, dict) and attributes.get(child, MISSING) is value:
            del attributes[child]
