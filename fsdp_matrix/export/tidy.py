"""Rewrites of a pruned function's text that change nothing a run does, so a reader sees less:

- an argument its callee never reads (the traced run raised before it was used), when it is side-effect free: its
  value then goes dead, and simplify.py drops it;
- ``with contextlib.nullcontext(...):`` without ``as``: its body, dedented;
- ``**{}`` in a call, and a local ``{}`` only ever spread as ``**name``;
- ``None or x`` (an inlined default), and a ``return None`` that ends a function.
"""

from __future__ import annotations

import ast
import re
from typing import Dict, List, Set

from fsdp_matrix.export.inline import _start
from fsdp_matrix.export.simplify import _drop, _locals, _replace, function_of, is_pure


def unused_params(texts: Dict[str, str]) -> Dict[str, Set[str]]:
    """Per top-level function (name -> text): the parameters with a default that its kept body never reads (a
    traced run that raised early leaves most of a function's parameters unread)."""
    out: Dict[str, Set[str]] = {}
    for name, text in texts.items():
        fn = ast.parse(text).body[0]
        if not isinstance(fn, ast.FunctionDef) or fn.args.kwarg is not None:
            continue
        a = fn.args
        positional = a.posonlyargs + a.args
        optional = [x.arg for x in positional[len(positional) - len(a.defaults) :]]
        optional += [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
        read = {n.id for stmt in fn.body for n in ast.walk(stmt) if isinstance(n, ast.Name)}
        unread = {x for x in optional if x not in read}
        if unread:
            out[name] = unread
    return out


def drop_unused_keywords(text: str, unused: Dict[str, Set[str]], pure: Set[str]) -> str:
    """``f(x, k=v)`` written ``f(x)`` where ``f`` never reads ``k`` (see unused_params) and ``v`` is side-effect
    free: a value computed only to be passed along, unread, then goes as dead (calls on one line only)."""
    fn = function_of(text)
    if fn is None:
        return text
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    local, spans = _locals(fn), []
    for node in (c for c in calls if c.func.id in unused):
        gone = [k for k in node.keywords if k.arg in unused[node.func.id] and is_pure(k.value, pure, local)]
        if not gone or node.lineno != node.end_lineno:
            continue
        call = ast.Call(node.func, node.args, [k for k in node.keywords if k not in gone])
        spans.append((node.lineno, node.col_offset, node.end_col_offset, ast.unparse(call)))
    # an outer call rewritten whole would undo an inner one on the same line: one call per line per pass
    spans = list({s[0]: s for s in sorted(spans, key=lambda s: s[2] - s[1])}.values())
    return "\n".join(_replace(text.splitlines(), spans)) if spans else text


def _null_with(fn: ast.FunctionDef, lines: List[str]) -> List[str]:
    for node in ast.walk(fn):
        if not isinstance(node, ast.With) or len(node.items) != 1 or node.items[0].optional_vars is not None:
            continue
        call = node.items[0].context_expr
        name = ast.unparse(call.func) if isinstance(call, ast.Call) else ""
        if name not in ("contextlib.nullcontext", "nullcontext"):
            continue
        head, first = node.lineno, _start(node.body[0])
        shift = len(lines[first - 1]) - len(lines[first - 1].lstrip()) - node.col_offset
        body = [x[shift:] if x[:shift].strip() == "" else x for x in lines[first - 1 : node.end_lineno]]
        return lines[: head - 1] + body + lines[node.end_lineno :]
    return lines


_EMPTY_SPREAD = re.compile(r",\s*\*\*\{\}(\s*\))")


def _empty_kwargs(fn: ast.FunctionDef, lines: List[str]) -> List[str]:
    """``name = {}`` read only as ``**name``: both go (the spread of an empty dict passes nothing)."""
    for stmt in fn.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        if not (isinstance(stmt.value, ast.Dict) and not stmt.value.keys):
            continue
        name = stmt.targets[0].id
        uses = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == name and n is not stmt.targets[0]]
        spread = [k for n in ast.walk(fn) if isinstance(n, ast.Call) for k in n.keywords if k.arg is None]
        spread = [k for k in spread if isinstance(k.value, ast.Name) and k.value.id == name]
        if len(uses) != len(spread) or not all(k.value.lineno == k.value.end_lineno for k in spread):
            continue
        spans = [(k.value.lineno, k.value.col_offset, k.value.end_col_offset, "{}") for k in spread]
        return _drop(_replace(lines, spans), [stmt])
    return lines


def _none_or(fn: ast.FunctionDef, lines: List[str]) -> List[str]:
    spans = []
    for node in ast.walk(fn):
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and len(node.values) == 2:
            first, second = node.values
            if isinstance(first, ast.Constant) and first.value is None and node.lineno == node.end_lineno:
                kept = lines[node.lineno - 1].encode()[second.col_offset : second.end_col_offset].decode()
                spans.append((node.lineno, node.col_offset, node.end_col_offset, kept))
    return _replace(lines, spans) if spans else lines


def _trailing_return_none(fn: ast.FunctionDef, lines: List[str]) -> List[str]:
    last = fn.body[-1]
    if len(fn.body) > 1 and isinstance(last, ast.Return) and isinstance(last.value, ast.Constant):
        if last.value.value is None and last.lineno == last.end_lineno:
            return _drop(lines, [last])
    return lines


def tidy(text: str) -> str:
    """One top-level function's text with the rewrites of the module docstring applied (one at a time: each reads
    the line numbers of the text it is given)."""
    for _ in range(20):
        fn = function_of(text)
        if fn is None:
            return text
        lines = text.splitlines()
        for rewrite in (_null_with, _empty_kwargs, _none_or, _trailing_return_none):
            new = rewrite(fn, lines)
            if new != lines:
                break
        out = _EMPTY_SPREAD.sub(r"\1", "\n".join(new))
        out = re.sub(r"\(\*\*\{\}\)", "()", out)
        if out == text:
            return text
        text = out
    return text
