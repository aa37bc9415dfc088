"""Names a cell binds to the object they already held, which identity cannot see.

A name is an output when the cell binds it. The runtime tells that from the object's
identity before and after the cell, as the reference harness does, and for inputs that is
its rule too. But the reference's namespace holds only the inputs, where a kernel's also
holds the preload's names and IPython's: ``import numpy as np`` under a preload that
imported it, ``CONST = 7`` over the preload's 7, or ``from IPython.display import display``
bind the very object the name had, so by identity the cell bound nothing, and a later cell
that reads the name found no output to read.

:class:`MarkRebinds` finds, in the cell's syntax tree, the statements that may bind such a
name (at module level, in any branch or loop of it), and adds after each a call that
records the names once the statement has run: a binding in a branch that did not run is no
output. Stdlib only, shipped into kernels with the runtime.
"""

from __future__ import annotations

import ast
import contextlib
import sys
from collections.abc import Iterable
from typing import Any

MARKER = "__import__('strata_kernel_agent').rebinding.bound"


def bound_names(statement: ast.stmt) -> set[str]:
    """The names ``statement`` itself binds in the namespace it runs in (``'*'`` plus the
    module name for a star import), not those of statements nested in it."""
    names: set[str] = set()
    if isinstance(statement, ast.Assign):
        for target in statement.targets:
            names |= _target_names(target)
    elif isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
        if not isinstance(statement, ast.AnnAssign) or statement.value is not None:
            names |= _target_names(statement.target)
    elif isinstance(statement, ast.Import):
        names |= {alias.asname or alias.name.partition(".")[0] for alias in statement.names}
    elif isinstance(statement, ast.ImportFrom):
        for alias in statement.names:
            if alias.name == "*":
                if statement.level == 0 and statement.module:
                    names.add("*" + statement.module)
            else:
                names.add(alias.asname or alias.name)
    elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names.add(statement.name)
    names |= _walrus_names(statement)
    return names


def _target_names(target: ast.expr) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        found: set[str] = set()
        for element in target.elts:
            found |= _target_names(element)
        return found
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return set()  # attributes and subscripts bind no name


def _walrus_names(statement: ast.stmt) -> set[str]:
    """``(x := …)`` in the statement's own expressions (a comprehension's included: its
    walrus binds in the enclosing scope), not in the bodies of functions or classes."""
    found: set[str] = set()
    children = ast.iter_child_nodes(statement)
    pending = [child for child in children if not isinstance(child, ast.stmt)]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
        if not isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            pending.extend(ast.iter_child_nodes(node))
    return found


_watch: dict[str, Any] = {"names": frozenset(), "found": None}


def start(names: Iterable[str]) -> set[str]:
    """Watch ``names`` in the cell about to run; returns the set the ones it binds go in."""
    found: set[str] = set()
    _watch["names"], _watch["found"] = frozenset(names), found
    return found


def stop() -> None:
    _watch["names"], _watch["found"] = frozenset(), None


class MarkRebinds(ast.NodeTransformer):
    """Add, after each statement that may bind a watched name, a call recording that it did."""

    def visit_Module(self, node: ast.Module) -> ast.Module:
        watched = _watch["names"]
        if watched:
            # IPython drops a transformer that raises: this one never does, whatever the cell
            with contextlib.suppress(Exception):
                node.body = self._mark(node.body, watched, top=True)
        return node

    def _mark(
        self, body: list[ast.stmt], watched: frozenset[str], top: bool = False
    ) -> list[ast.stmt]:
        marked: list[ast.stmt] = []
        for index, statement in enumerate(body):
            if top and index == len(body) - 1 and isinstance(statement, ast.Expr):
                marked.append(statement)  # the cell's last expression stays last: it is shown
                break
            if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for field in ("body", "orelse", "finalbody"):
                    nested = getattr(statement, field, None)
                    if isinstance(nested, list) and nested:
                        setattr(statement, field, self._mark(nested, watched))
                for handler in getattr(statement, "handlers", ()):  # try, try*
                    handler.body = self._mark(handler.body, watched)
                for case in getattr(statement, "cases", ()):  # match
                    case.body = self._mark(case.body, watched)
            names = _relevant(_header_names(statement), watched)
            # what a loop or with header binds is bound when its body starts
            if names and isinstance(statement, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
                statement.body.insert(0, _call(names, statement.body[0]))
            marked.append(statement)
            names = _relevant(bound_names(statement), watched)
            if names:
                marked.append(_call(names, statement))
        return marked


def _header_names(statement: ast.stmt) -> set[str]:
    if isinstance(statement, (ast.For, ast.AsyncFor)):
        return _target_names(statement.target)
    names: set[str] = set()
    if isinstance(statement, (ast.With, ast.AsyncWith)):
        for item in statement.items:
            if item.optional_vars is not None:
                names |= _target_names(item.optional_vars)
    return names


def _relevant(names: set[str], watched: frozenset[str]) -> list[str]:
    return sorted(name for name in names if name.startswith("*") or name in watched)


def _call(names: list[str], where: ast.stmt) -> ast.stmt:
    call = ast.parse(f"{MARKER}({tuple(names)!r})").body[0]
    for node in ast.walk(call):  # where the statement it follows is, for any traceback
        ast.copy_location(node, where)
    return call


def bound(names: Iterable[str]) -> None:
    """Called by the marked cell after a statement that bound ``names``."""
    found = _watch["found"]
    if found is None:
        return
    for name in names:
        if name.startswith("*"):
            found.update(_star_names(name[1:]) & _watch["names"])
        elif name in _watch["names"]:
            found.add(name)


def _star_names(module_name: str) -> set[str]:
    module = sys.modules.get(module_name)
    if module is None:
        return set()
    public = getattr(module, "__all__", None)
    if public is None:
        public = [name for name in vars(module) if not name.startswith("_")]
    return {name for name in public if isinstance(name, str)}
