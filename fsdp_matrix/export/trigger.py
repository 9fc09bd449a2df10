"""The report's trigger, read off the pruned script: the statements that call the PEFT / FSDP API and the one that
raised in the traced run, in the order they run from ``run``."""

from __future__ import annotations

import ast
from typing import List, Set

from fsdp_matrix.export.layout import NOT_REPRODUCED, RAISED_HERE


def trigger(texts: List[str], api: Set[str]) -> List[str]:
    """Trigger lines in the order they run: statements in order, a called function's before the rest."""
    functions, texts_by_name = {}, {}
    for text in texts:
        fn = ast.parse(text).body[0]
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions[fn.name], texts_by_name[fn.name] = fn, text
    out: List[str] = []
    visited: Set[str] = set()

    def calls_in_order(node: ast.AST) -> List[ast.Call]:
        found: List[ast.Call] = []
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.stmt, ast.Lambda)):
                found += calls_in_order(child)
        return found + ([node] if isinstance(node, ast.Call) else [])

    def visit(name: str) -> None:
        if name in visited or name not in functions:
            return
        visited.add(name)
        fn = functions[name]
        body = [s for s in ast.walk(fn) if isinstance(s, ast.stmt) and not hasattr(s, "body")]
        body.sort(key=lambda s: s.lineno)
        lines = texts_by_name[name].splitlines()
        for stmt in body:
            if _is_stop(stmt):
                continue
            calls = calls_in_order(stmt)
            raised = RAISED_HERE in lines[stmt.end_lineno - 1]
            if {_root(c.func) for c in calls} & api or raised:
                line = " ".join(ast.unparse(stmt).split())
                line = line if len(line) <= 90 else line[:87] + "..."
                out.append(f"{fn.name}(): {line}" + ("   <- raises" if raised else ""))
            for call in calls:
                if isinstance(call.func, ast.Name):
                    visit(call.func.id)

    visit("run")
    return out


def _is_stop(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Raise) and ast.unparse(stmt) == ast.unparse(ast.parse(NOT_REPRODUCED).body[0])


def _root(node: ast.AST) -> str:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""
