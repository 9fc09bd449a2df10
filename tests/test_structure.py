"""The harness's shape: no import circle between rooms, none inside a room, and no function over 60 lines.

A room is a subpackage of ``fsdp_matrix`` (``runner``, ``envs``, ...) or one of its flat modules (``matrix``,
``records``, ...). Every import counts, at module level or deferred inside a function: a deferred import that runs
back up is still an arrow back up. With no circle among rooms, the rooms stand on floors and every arrow points
down.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fsdp_matrix"
MAX_LINES = 60

# Offenders allowed by name: none. A new one is a design question, not a line to add here lightly.
ALLOWED_MODULE_CYCLES: Set[Tuple[str, ...]] = set()
ALLOWED_ROOM_ARROWS: Set[str] = set()
ALLOWED_LONG: Set[str] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(dotted: str) -> bool:
    """Does ``dotted`` name a module or package of this repository?"""
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path) -> Iterator[Tuple[str, int]]:
    """(module imported, line) for every import in ``path``, deferred ones included; ``from x import y`` names
    ``x.y`` when that is a module, else ``x``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                yield (f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}") else base), node.lineno


def module_graph() -> Dict[str, Dict[str, List[int]]]:
    """module -> {imported module of the package -> lines}."""
    graph: Dict[str, Dict[str, List[int]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        edges = graph.setdefault(module_name(path), {})
        for target, line in imports(path):
            if target == "fsdp_matrix" or target.startswith("fsdp_matrix."):
                edges.setdefault(target, []).append(line)
    return graph


def room(module: str) -> str:
    """``fsdp_matrix.runner.launcher`` -> ``runner``; ``fsdp_matrix.matrix`` -> ``matrix``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "fsdp_matrix"


def room_graph(allowed: Set[str] = frozenset()) -> Dict[str, Dict[str, List[str]]]:
    """room -> {other room -> ["module:line -> module", ...]}, leaving out the ``allowed`` arrows."""
    rooms: Dict[str, Dict[str, List[str]]] = {}
    for source, targets in module_graph().items():
        for target, lines in targets.items():
            a, b = room(source), room(target)
            rooms.setdefault(a, {}).setdefault(b, [])
            rooms.setdefault(b, {})
            if a != b and a != "fsdp_matrix" and b != "fsdp_matrix" and f"{source} -> {target}" not in allowed:
                rooms[a][b] += [f"{source}:{line} -> {target}" for line in lines]
    return {a: {b: why for b, why in out.items() if why} for a, out in rooms.items()}


def cycles(graph: Dict[str, Dict[str, object]]) -> List[Tuple[str, ...]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[Tuple[str, ...]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_circle_among_rooms():
    graph = room_graph(ALLOWED_ROOM_ARROWS)
    circles = cycles(graph)
    why = [arrow for c in circles for a in c for b in c if b in graph[a] for arrow in graph[a][b]]
    assert not circles, f"import circles among rooms {circles}:\n" + "\n".join(why)


def test_no_circle_among_the_modules_of_a_room():
    graph = module_graph()
    inside = {a: {b: v for b, v in out.items() if room(a) == room(b) and b in graph} for a, out in graph.items()}
    assert set(cycles(inside)) <= ALLOWED_MODULE_CYCLES


def test_the_allowlists_name_only_what_is_still_there():
    """An allowlisted offender that is gone leaves the list (so the list can only shrink)."""
    graph = module_graph()
    inside = {a: {b: v for b, v in out.items() if room(a) == room(b) and b in graph} for a, out in graph.items()}
    assert ALLOWED_MODULE_CYCLES <= set(cycles(inside))
    assert ALLOWED_LONG <= {name for name, _ in long_functions()}
    arrows = {
        arrow.split(":")[0] + " -> " + arrow.split(" -> ")[1]
        for out in room_graph().values()
        for why in out.values()
        for arrow in why
    }
    assert ALLOWED_ROOM_ARROWS <= arrows


def long_functions() -> Iterator[Tuple[str, int]]:
    """("path:function", lines) for every function over MAX_LINES lines in the package, repros/ and noxfile.py."""
    paths = [*sorted(PACKAGE.rglob("*.py")), *sorted((ROOT / "repros").rglob("*.py")), ROOT / "noxfile.py"]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_LINES:
                    yield f"{path.relative_to(ROOT).as_posix()}:{node.name}", length


def test_no_function_over_60_lines():
    over = {name: length for name, length in long_functions() if name not in ALLOWED_LONG}
    assert not over, f"functions over {MAX_LINES} lines: {over}"


@pytest.mark.parametrize("text, expected", [("{'a': {'b': 1}, 'b': {'a': 1}}", [("a", "b")]), ("{'a': {'b': 1}}", [])])
def test_the_circle_finder_finds_a_circle_and_only_a_circle(text, expected):
    assert cycles(ast.literal_eval(text)) == expected
