"""The import graph of services/ and cache_actor/ has no circle (the layers are lint-imports'),
and no module of theirs outgrows one job (450 lines)."""

from __future__ import annotations

from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 450


def cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """Strongly connected sets of more than one module (or a module importing itself)."""
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm; the graph is a few hundred nodes
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if not imported.startswith(package):
                continue
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1 or module in graph.find_modules_directly_imported_by(module):
                found.append(sorted(component))

    for module in modules:
        if module not in index:
            visit(module)
    return found


def test_no_import_circle_in_services_or_cache_actor() -> None:
    # type-checking and function-local imports count: a circle hidden there is still a circle
    graph = grimp.build_graph("services", "cache_actor")
    assert cycles(graph, "services") == []
    assert cycles(graph, "cache_actor") == []


def test_the_check_finds_a_circle() -> None:
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(module)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.a")
    graph.add_import(importer="pkg.c", imported="pkg.a")
    assert cycles(graph, "pkg") == [["pkg.a", "pkg.b"]]


def test_every_module_stays_small_enough_to_do_one_job() -> None:
    # the generated protobuf code is not written by hand
    modules = [
        path
        for package in ("services", "cache_actor")
        for path in sorted((ROOT / package).rglob("*.py"))
        if "proto" not in path.relative_to(ROOT).parts
    ]
    assert len(modules) > 50
    too_long = {
        str(path.relative_to(ROOT)): lines
        for path in modules
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert too_long == {}
