"""Monkeypatches of much-patched standard library modules, undone by the reset.

A cell that replaces or deletes a function or class of one of these modules
(``time.time = frozen``, ``datetime.datetime = FakeDatetime``, ``warnings.warn = quiet``,
``ssl._create_default_https_context = ssl._create_unverified_context``,
``socket.getaddrinfo = ipv4_only``) would leave it so for every later request on the kernel;
a fresh interpreter, the reference's cell process, starts without it.
:func:`capture_module_patches` records their callables at the baseline,
:func:`restore_module_patches` puts back those a cell replaced and any attribute it deleted.
(``os``, ``io``, ``json``, ``pickle``, ``pathlib`` and ``builtins`` are guarded by
``interpreter`` itself, even before the kernel replies.)

Only callables are compared: a module's data (caches, counters, a flag set on first use) is
its own business, and reading every value would cost a cache miss each (0.6 ms for the
9,000 values of the whole standard library, after a cell); these modules' callables take
about 60 us. Attributes a cell adds stay (a submodule imported later is one).

Beyond those modules, the code of each cell is read before it runs (an AST pass, tens of
microseconds): a module or class that is already loaded and whose attribute the cell sets or
deletes by name (``math.pi = 3``, ``string.ascii_letters = ...``, ``del json.x``,
``setattr(np, "x", 1)``, ``Model.threshold = 0.5`` on a preloaded class, through the cell's
own imports or a module it was handed) has its namespace recorded then, and the reset puts
it back exactly: values, deleted and added attributes (a submodule imported meanwhile
stays). Code the cell reaches only indirectly (a library that patches another, ``exec``)
is not seen.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import operator
import sys
import types
from typing import Any

from .baseline import MISSING, get_shell

_PATCHED_MODULES = (
    "time",
    "datetime",
    "random",
    "uuid",
    "math",
    "warnings",
    "socket",
    "ssl",
    "subprocess",
)
# (module __dict__, a copy of it, a getter of its callables, their values) at the baseline
_patchable: list[tuple[Any, ...]] = []


def capture_module_patches() -> None:
    """Record the callables of the modules above that are loaded now (the baseline)."""
    _patchable.clear()
    for name in _PATCHED_MODULES:
        module = sys.modules.get(name)
        attributes = getattr(module, "__dict__", None)
        if not isinstance(attributes, dict):
            continue
        names = [key for key, value in list(attributes.items()) if callable(value)]
        if len(names) < 2:  # itemgetter of one name gives the value, not a tuple
            names += ["__name__", "__name__"]
        get = operator.itemgetter(*names)
        _patchable.append((attributes, dict(attributes), get, get(attributes)))


def restore_module_patches() -> None:
    """Put back each recorded callable a cell replaced, and each attribute it deleted."""
    for attributes, baseline, get, values in _patchable:
        if len(attributes) >= len(baseline) and _same(get, attributes, values):
            continue
        for key, value in baseline.items():
            current = attributes.get(key, MISSING)
            if current is not value and (current is MISSING or callable(value)):
                attributes[key] = value


def _same(get: Any, attributes: Any, values: Any) -> Any:
    try:
        return get(attributes) == values  # identity first: an unchanged value's __eq__ is unused
    except Exception:  # a callable deleted, or a replacement whose __eq__ raises
        return False


# id(owner) -> (owner, its namespace before the cell that sets its attributes ran)
_touched: dict[int, tuple[Any, dict[str, Any]]] = {}


class _WatchAttributeStores(ast.NodeTransformer):
    """An AST "transformer" that changes nothing: it records, before the cell runs, the
    namespaces of the loaded modules and classes whose attributes the cell's code sets."""

    def visit_Module(self, node: Any) -> Any:
        with contextlib.suppress(Exception):  # never in the way of the cell
            _record_owners(node, get_shell().user_ns)
        return node


def watch_attribute_stores(shell: Any) -> None:
    """Have every cell's code read for attribute stores before it runs (idempotent)."""
    if not any(isinstance(t, _WatchAttributeStores) for t in shell.ast_transformers):
        shell.ast_transformers.append(_WatchAttributeStores())


def _record_owners(tree: Any, ns: dict[str, Any]) -> None:
    aliases: dict[str, Any] = {}
    # name -> the module it names, for the cell's imports of unloaded modules
    imported: dict[str, tuple[str, ...]] = {}
    owners: list[Any] = []
    assigned: list[tuple[str, ast.expr]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name if alias.asname else alias.name.partition(".")[0]
                aliases[alias.asname or name] = sys.modules.get(name)
                imported[alias.asname or name] = (name,)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            module = sys.modules.get(node.module)
            for alias in node.names:
                found = sys.modules.get(f"{node.module}.{alias.name}")
                if found is None and module is not None:
                    found = vars(module).get(alias.name)
                aliases[alias.asname or alias.name] = found
                imported[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            owners.append(node.value)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
            owners.append(_namespace_of(node.value))  # vars(m)["x"] = 1, m.__dict__["x"] = 1
        elif isinstance(node, ast.Call):
            function = node.func
            if isinstance(function, ast.Name) and function.id in _SETTERS and node.args:
                owners.append(node.args[0])  # setattr(m, "x", 1)
            elif isinstance(function, ast.Attribute) and function.attr in _DICT_CHANGES:
                owners.append(_namespace_of(function.value))  # vars(m).update(x=1)
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and _dotted(node.value)
        ):
            assigned.append((node.targets[0].id, node.value))  # m = string, then m.x = 1
    for name, value in assigned:
        if name not in aliases:
            aliases[name] = _resolve(value, aliases, ns)
            chain = _dotted(value)
            if aliases[name] is None and chain[0] in imported:
                imported[name] = (*imported[chain[0]], *chain[1:])
    for expression in owners:
        if expression is None:
            continue
        owner = _resolve(expression, aliases, ns)
        if _watched(owner, ns) and id(owner) not in _touched:
            _touched[id(owner)] = (owner, dict(vars(owner)))
        elif owner is None:
            chain = _dotted(expression)
            if chain and chain[0] in imported:  # not loaded yet: the cell imports it
                first, *path = imported[chain[0]]
                _first_imported.add((first, (*path, *chain[1:])))


_SETTERS = frozenset(("setattr", "delattr"))
_DICT_CHANGES = frozenset(("update", "pop", "popitem", "setdefault", "clear", "__setitem__"))


def _namespace_of(expression: Any) -> Any:
    """``X`` for ``vars(X)`` or ``X.__dict__``; None for anything else."""
    if (
        isinstance(expression, ast.Call)
        and isinstance(expression.func, ast.Name)
        and expression.func.id == "vars"
        and len(expression.args) == 1
    ):
        return expression.args[0]
    if isinstance(expression, ast.Attribute) and expression.attr == "__dict__":
        return expression.value
    return None


def _dotted(expression: Any) -> Any:
    """``a.b.c`` as ["a", "b", "c"]; None for anything else."""
    names = []
    while isinstance(expression, ast.Attribute):
        names.append(expression.attr)
        expression = expression.value
    if not isinstance(expression, ast.Name):
        return None
    return [expression.id, *reversed(names)]


# (module name, attribute path) of owners in modules the cell itself imported first
_first_imported: set[tuple[str, tuple[str, ...]]] = set()


def _resolve(expression: Any, aliases: Any, ns: dict[str, Any]) -> Any:
    """The module or class a dotted name stands for before the cell runs (None if unknown);
    read from namespaces only, so no module ``__getattr__`` or descriptor runs."""
    if isinstance(expression, ast.Name):
        name = expression.id
        if name in aliases:
            return aliases[name]
        return ns.get(name, vars(builtins).get(name))
    if isinstance(expression, ast.Attribute):
        base = _resolve(expression.value, aliases, ns)
        if isinstance(base, (types.ModuleType, type)):
            return vars(base).get(expression.attr)
    return None


def _watched(owner: Any, ns: dict[str, Any]) -> Any:
    if isinstance(owner, types.ModuleType):
        # sys's hooks and the user's own namespace have resets of their own
        return owner is not sys and vars(owner) is not ns
    return isinstance(owner, type) and owner.__module__ != "builtins"


def restore_touched(problems: list[str]) -> None:
    """Put back the namespace of each module and class a cell set attributes of.

    A module the cell imported itself had no namespace to record before it ran: when the
    cell set attributes of it (or of a class in it), the kernel cannot be verified clean."""
    first, touched = list(_first_imported), list(_touched.values())
    _first_imported.clear()
    _touched.clear()
    for name, path in first:
        owner = sys.modules.get(name)
        for attribute in path:
            if not isinstance(owner, (types.ModuleType, type)):
                break
            owner = vars(owner).get(attribute)
        if _watched(owner, {}):
            shown = ".".join((name, *path))
            problems.append(f"a cell set attributes of {shown}, which it imported itself")
    for owner, saved in touched:
        current = vars(owner)
        if isinstance(owner, types.ModuleType):
            for key, value in saved.items():
                if current.get(key, MISSING) is not value:
                    current[key] = value
            for key in [k for k in list(current) if k not in saved]:
                if not isinstance(current[key], types.ModuleType):  # a submodule stays
                    del current[key]
            continue
        for key, value in saved.items():
            if current.get(key, MISSING) is not value:
                with contextlib.suppress(Exception):
                    setattr(owner, key, value)
        for key in [k for k in list(current) if k not in saved]:
            with contextlib.suppress(Exception):
                delattr(owner, key)
