"""The import graph of a source tree, read with ``ast`` (nothing is imported): every ``import`` and
``from ... import`` of every module, at module level and inside functions, classes and ``if``
blocks alike (a function-level import is as much a dependency as a top-level one: it only runs
later). Used by tests/cpu/test_layering.py, which also feeds it synthetic trees."""

from __future__ import annotations

import ast
from pathlib import Path


def module_names(root: Path, package: str) -> dict[str, Path]:
    """{dotted module name: file} of the package directory ``root / package`` (``__init__.py``
    is the package itself)."""
    out = {}
    for p in sorted((root / package).rglob("*.py")):
        parts = p.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported module of ``known``, line) for every import statement in ``path``. ``from X import
    a``: ``X.a`` when that is a module of ``known``, else ``X``; ``import X.Y``: ``X.Y``."""
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    out.append((a.name, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node)
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in known:
                    out.append((sub, node.lineno))
                elif base in known:
                    out.append((base, node.lineno))
    return out


def graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """{module: {imported module: first line}} over ``modules`` (self-imports left out)."""
    known = set(modules)
    g: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges = g.setdefault(name, {})
        for dep, line in imports_of(name, path, known):
            if dep != name:
                edges.setdefault(dep, line)
    return g


def cycles(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one cycle
    through it written out (``a -> b -> a``), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(_one_cycle(g, c) for c in comps)


def _one_cycle(g: dict[str, dict[str, int]], comp: list[str]) -> list[str]:
    """A path from the component's first module back to itself, inside the component (BFS)."""
    inside, start = set(comp), comp[0]
    prev: dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(g.get(v, {})):
            if w == start:
                path = [start]
                while v != start:
                    path.insert(1, v)
                    v = prev[v]
                return path + [start]
            if w in inside and w not in prev:
                prev[w] = v
                todo.append(w)
    raise AssertionError(f"no cycle through {comp}")
