"""The import graph of both packages has no cycles, type-checking imports included.

A cycle means two modules cannot be read, tested or moved one without the other; the layer
rules in ``pyproject.toml`` (``lint-imports``) order the packages, this orders the modules.
"""

from __future__ import annotations

import grimp


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module) & modules:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return found


def _leaves(graph: grimp.ImportGraph) -> set[str]:
    """Modules, not packages: a package's ``__init__`` re-exporting its modules is not a
    cycle with them."""
    modules = set(graph.modules)
    return {m for m in modules if not any(o.startswith(m + ".") for o in modules)}


def test_no_module_imports_itself_through_others() -> None:
    graph = grimp.build_graph("kernel_worker", "kernel_pool")
    assert _cycles(graph, _leaves(graph)) == []


def test_the_check_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph, _leaves(graph)) == [["p.a", "p.b"]]
