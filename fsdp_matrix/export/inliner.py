"""Inline a function of the exported script into its only caller, so the trigger reads as plain library calls.

A call is inlined when it is a whole statement (``f(...)``, ``x = f(...)``, ``return f(...)``), ``f`` is a plain
top-level function called from nowhere else and never passed along, its body returns only as its last statement,
defines nothing nested, and none of its locals is a name the caller uses. Arguments that are names or constants
replace the parameters where they are read; any other argument is bound first (``param = arg``).
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set

from fsdp_matrix.export.layout import LINE_LENGTH
from fsdp_matrix.export.simplify import _locals

_ATOMS = (ast.Name, ast.Constant, ast.Attribute)


def _calls(texts: Dict[str, str]) -> Dict[str, List[str]]:
    """Callee -> callers (one entry per call); a function also read as a value maps to ``["?"]``."""
    out: Dict[str, List[str]] = {}
    for caller, text in texts.items():
        tree = ast.parse(text)
        fn = tree.body[0]
        shadowed = set()
        if isinstance(fn, ast.FunctionDef):
            shadowed = _locals(fn) | {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        heads = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in texts:
                out.setdefault(node.func.id, []).append(caller)
                heads.add(id(node.func))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in texts and id(node) not in heads and node.id not in shadowed:
                out.setdefault(node.id, []).append("?")
    return out


def _inlinable(fn: ast.AST) -> bool:
    if not isinstance(fn, ast.FunctionDef) or fn.decorator_list:
        return False
    args = fn.args
    if args.vararg or args.kwarg or args.posonlyargs:
        return False
    for node in ast.walk(fn):
        if node is not fn and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            return False
        if isinstance(node, (ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal)):
            return False
        if isinstance(node, ast.Return) and node is not fn.body[-1]:
            return False
    return True


def _bind(fn: ast.FunctionDef, call: ast.Call) -> Optional[Dict[str, ast.expr]]:
    params = [a.arg for a in fn.args.args + fn.args.kwonlyargs]
    positional = [a.arg for a in fn.args.args]
    defaults = dict(zip(positional[len(positional) - len(fn.args.defaults) :], fn.args.defaults))
    defaults.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None})
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    if len(call.args) > len(positional):
        return None
    bound: Dict[str, ast.expr] = dict(zip(positional, call.args))
    bound.update({k.arg: k.value for k in call.keywords})
    for name in params:
        if name not in bound:
            if name not in defaults:
                return None
            bound[name] = defaults[name]
    return bound


def _rename(lines: List[str], fn: ast.FunctionDef, names: Dict[str, str]) -> List[str]:
    spans = sorted(
        (
            (n.lineno, n.col_offset, n.end_col_offset, names[n.id])
            for n in ast.walk(fn)
            if isinstance(n, ast.Name) and n.id in names
        ),
        reverse=True,
    )
    out = list(lines)
    for lineno, col, end, rep in spans:
        raw = out[lineno - 1].encode()
        out[lineno - 1] = (raw[:col] + rep.encode() + raw[end:]).decode()
    return out


def _body_lines(text: str, fn: ast.FunctionDef) -> List[str]:
    lines = text.splitlines()
    first = fn.body[0].lineno
    while first > 1 and lines[first - 2].lstrip().startswith("#"):
        first -= 1
    return lines[first - 1 : fn.body[-1].end_lineno]


def inline_once(texts: Dict[str, str]) -> Optional[Dict[str, str]]:
    """One inlining (see the module docstring), or None when nothing can be inlined."""
    callers = _calls(texts)
    trees = {name: ast.parse(text).body[0] for name, text in texts.items()}
    for callee, who in callers.items():
        fn = trees[callee]
        if len(who) != 1 or who[0] in ("?", callee) or not _inlinable(fn):
            continue
        caller = who[0]
        outer = trees[caller]
        if not isinstance(outer, ast.FunctionDef):
            continue
        stmt = next(
            (
                s
                for s in ast.walk(outer)
                if isinstance(s, (ast.Expr, ast.Assign, ast.Return))
                and isinstance(s.value, ast.Call)
                and isinstance(s.value.func, ast.Name)
                and s.value.func.id == callee
                and (not isinstance(s, ast.Assign) or len(s.targets) == 1)
            ),
            None,
        )
        if stmt is None or stmt.lineno != stmt.end_lineno and _multiline_arg(stmt):
            continue
        bound = _bind(fn, stmt.value)
        if bound is None:
            continue
        used = {n.id for n in ast.walk(outer) if isinstance(n, ast.Name)}
        # the callee's locals must not overwrite the caller's; the name the call's value goes to is overwritten
        # anyway, unless an argument still reads it
        target = (
            {stmt.targets[0].id} if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name) else set()
        )
        read_by_args = {n.id for a in bound.values() for n in ast.walk(a) if isinstance(n, ast.Name)}
        if not ((_locals(fn) - set(bound)) & used) <= (target - read_by_args):
            continue
        renames: Dict[str, str] = {}
        prologue: List[str] = []
        stored = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        for name, arg in bound.items():
            if _simple(arg) and name not in stored and not (_base(arg) & stored):
                renames[name] = ast.unparse(arg)
            elif any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(fn)):
                if name in used:
                    break
                prologue.append(f"{name} = {ast.unparse(arg)}")
        else:
            target = ast.get_source_segment(texts[caller], stmt.targets[0]) if isinstance(stmt, ast.Assign) else None
            body = _inlined_body(texts[callee], fn, renames, stmt, target)
            lines = texts[caller].splitlines()
            indent = " " * stmt.col_offset
            new = [indent + p for p in prologue] + [indent + line for line in body]
            out = dict(texts)
            out[caller] = "\n".join(lines[: stmt.lineno - 1] + new + lines[stmt.end_lineno :])
            del out[callee]
            return out
    return None


def _multiline_arg(stmt: ast.stmt) -> bool:
    return any(a.lineno != a.end_lineno for a in stmt.value.args + [k.value for k in stmt.value.keywords])


def _inlined_body(
    text: str, fn: ast.FunctionDef, renames: Dict[str, str], stmt: ast.stmt, target: Optional[str]
) -> List[str]:
    lines = _rename(text.splitlines(), fn, {k: v for k, v in renames.items() if k != v})
    body = _body_lines("\n".join(lines), fn)
    indent = fn.body[0].col_offset
    body = [line[min(indent, len(line) - len(line.lstrip())) :] for line in body]
    last = fn.body[-1]
    if isinstance(last, ast.Return):
        # the final ``return X`` becomes what the call statement did with the call's value
        head_index = len(body) - (last.end_lineno - last.lineno) - 1
        value = body[head_index][len("return") :].lstrip() if body[head_index].startswith("return") else None
        if value is not None:
            if isinstance(stmt, ast.Assign):
                body[head_index] = f"{target} = {value or 'None'}"
            elif isinstance(stmt, ast.Expr):
                # a value nobody takes: gone when reading it does nothing
                atom = not value or isinstance(ast.parse(value.split("#")[0] or "None").body[0].value, _ATOMS)
                body[head_index] = "pass" if atom else value
                if atom and len(body) > 1 and last.lineno == last.end_lineno:
                    del body[head_index]
    elif not isinstance(last, ast.Raise):
        if isinstance(stmt, ast.Assign):
            body.append(f"{target} = None")
        elif isinstance(stmt, ast.Return):
            body.append("return None")
    return body


def inline_all(texts: Dict[str, str], keep: Set[str] = frozenset(), limit: int = 50) -> Dict[str, str]:
    """Inline until nothing more can be; functions in ``keep`` (``run``) stay defined."""
    for _ in range(limit):
        new = inline_once({k: v for k, v in texts.items()})
        if new is None:
            return texts
        gone = set(texts) - set(new)
        if gone & keep:
            return texts
        texts = new
    return texts


def _base(arg: ast.expr) -> Set[str]:
    while isinstance(arg, ast.Attribute):
        arg = arg.value
    return {arg.id} if isinstance(arg, ast.Name) else set()


def _single_return(fn: ast.AST) -> Optional[ast.expr]:
    if not isinstance(fn, ast.FunctionDef) or fn.decorator_list or fn.args.vararg or fn.args.kwarg:
        return None
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    if any(isinstance(n, (ast.Lambda, ast.NamedExpr, ast.Yield, ast.Await)) for n in ast.walk(body[0].value)):
        return None
    return body[0].value


def _simple(arg: ast.expr) -> bool:
    """An argument that can be read twice or not at all without changing anything."""
    while isinstance(arg, ast.Attribute):
        arg = arg.value
    return isinstance(arg, (ast.Name, ast.Constant))


class _Substitute(ast.NodeTransformer):
    def __init__(self, bound: Dict[str, ast.expr]) -> None:
        self.bound = bound

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return self.bound.get(node.id, node) if isinstance(node.ctx, ast.Load) else node


def inline_expressions(texts: Dict[str, str]) -> Dict[str, str]:
    """Calls of a function whose body is one ``return EXPR`` replaced by EXPR with the arguments put in (only
    arguments that are names, constants or attributes of names), wherever such a call fits on its line."""
    trees = {name: ast.parse(text).body[0] for name, text in texts.items()}
    exprs = {name: e for name, fn in trees.items() if (e := _single_return(fn)) is not None}
    if not exprs:
        return texts
    out = dict(texts)
    for caller, text in texts.items():
        if caller in exprs:
            continue
        tree = ast.parse(text)
        # inside an f-string the expression's own quotes could close the string (before Python 3.12): leave those
        in_fstring = {id(n) for f in ast.walk(tree) if isinstance(f, ast.JoinedStr) for n in ast.walk(f)}
        spans = []
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in exprs):
                continue
            if id(node) in in_fstring:
                continue
            if node.lineno != node.end_lineno:
                continue
            bound = _bind(trees[node.func.id], node)
            if bound is None or not all(_simple(a) for a in bound.values()):
                continue
            expr = _Substitute(bound).visit(ast.parse(ast.unparse(exprs[node.func.id]), mode="eval").body)
            text_expr = ast.unparse(expr)
            if not isinstance(expr, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)):
                text_expr = f"({text_expr})"
            spans.append((node.lineno, node.col_offset, node.end_col_offset, text_expr))
        if spans:
            lines = text.splitlines()
            outer = [
                s
                for s in spans
                if not any(o is not s and o[0] == s[0] and o[1] <= s[1] and s[2] <= o[2] for o in spans)
            ]
            for lineno, col, end, rep in sorted(outer, reverse=True):
                raw = lines[lineno - 1].encode()
                line = (raw[:col] + rep.encode() + raw[end:]).decode()
                if len(line) <= LINE_LENGTH:  # a call that reads better than its expression on one long line stays
                    lines[lineno - 1] = line
            joined = "\n".join(lines)
            try:
                ast.parse(joined)
            except SyntaxError:
                continue  # a substitution that does not read back as Python: keep the calls as written
            out[caller] = joined
    return out
