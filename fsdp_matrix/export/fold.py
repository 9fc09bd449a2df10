"""Fold a cell's params into constants: ``params["k"]``, ``params.get("k", d)``, ``"k" in params`` and helper calls
``f(params, "k", default=d)``, in every function that takes the cell's ``params`` (an argument annotated as a dict or
Mapping, never reassigned); and evaluate an ``if`` test made of such lookups."""

from __future__ import annotations

import ast
import re
from typing import Any, Dict, List, Optional, Tuple


class Unknown(Exception):
    pass


CONVERTERS = {"flag": bool}
"""Helpers (workload/params.py) that return the cell's value converted, not as written: ``flag`` gives a bool for
a 0/1 axis (transformers' strict configs refuse ``use_cache = 1``)."""


_OPS = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
}


class Folder:
    """Finds the foldable params lookups of the script and evaluates constant tests over them."""

    def __init__(self, tree: ast.Module, params: Dict[str, Any]) -> None:
        self.params = params
        self.values: Dict[int, Any] = {}  # id(node) -> folded value
        self.spans: Dict[int, List[Tuple[int, int, str]]] = {}  # line -> (col, end_col, replacement)
        self.defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and self._takes_params(fn):
                for node in ast.walk(fn):
                    self._fold(node)

    @staticmethod
    def _takes_params(fn: ast.FunctionDef) -> bool:
        args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        arg = next((a for a in args if a.arg == "params"), None)
        if arg is None or not re.search(r"dict|mapping", ast.unparse(arg.annotation or ast.Constant("dict")), re.I):
            return False
        return not any(
            isinstance(n, ast.Name) and n.id == "params" and not isinstance(n.ctx, ast.Load) for n in ast.walk(fn)
        )

    def _lookup(self, node: ast.AST) -> Tuple[bool, Any]:
        def key(n: ast.AST) -> Optional[str]:
            return n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else None

        def is_params(n: ast.AST) -> bool:
            return isinstance(n, ast.Name) and n.id == "params"

        if isinstance(node, ast.Subscript) and is_params(node.value) and key(node.slice) in self.params:
            return True, self.params[key(node.slice)]
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            if key(node.left) is not None and is_params(node.comparators[0]):
                return True, (key(node.left) in self.params) == isinstance(node.ops[0], ast.In)
        if not isinstance(node, ast.Call):
            return False, None
        get = isinstance(node.func, ast.Attribute) and node.func.attr == "get" and is_params(node.func.value)
        args = node.args if get else node.args[1:] if node.args and is_params(node.args[0]) else None
        if not args or key(args[0]) is None:
            return False, None
        if key(args[0]) in self.params:
            value = self.params[key(args[0])]
            helper = node.func.id if isinstance(node.func, ast.Name) else None
            return True, CONVERTERS[helper](value) if helper in CONVERTERS and not get else value
        if get:
            default = args[1] if len(args) > 1 else None
        else:  # a helper's ``default`` parameter, by keyword or by its place in the helper's definition
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            fn = self.defs.get(node.func.id) if isinstance(node.func, ast.Name) else None
            names = [a.arg for a in fn.args.args] if fn is not None else []
            if default is None and "default" in names and names.index("default") < len(node.args):
                default = node.args[names.index("default")]
        if get and default is None:
            return True, None
        if isinstance(default, ast.Constant):
            return True, default.value
        return False, None

    def _fold(self, node: ast.AST) -> None:
        ok, value = self._lookup(node)
        if not ok or node.lineno != node.end_lineno:
            return
        self.values[id(node)] = value
        spans = self.spans.setdefault(node.lineno, [])
        span = (node.col_offset, node.end_col_offset, repr(value))
        # an outer lookup wins over one nested in it
        spans[:] = [s for s in spans if not (span[0] <= s[0] and s[1] <= span[1])]
        if not any(s[0] <= span[0] and span[1] <= s[1] for s in spans):
            spans.append(span)

    def apply(self, lines: List[str]) -> List[str]:
        out = list(lines)
        for lineno, spans in self.spans.items():
            text = out[lineno - 1].encode()  # ast offsets count UTF-8 bytes
            for col, end, rep in sorted(spans, reverse=True):
                text = text[:col] + rep.encode() + text[end:]
            out[lineno - 1] = text.decode()
        return out

    def value(self, node: ast.AST) -> Any:
        """The constant a test evaluates to; Unknown when it does not fold."""
        if id(node) in self.values:
            return self.values[id(node)]
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return tuple(self.value(e) for e in node.elts)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not self.value(node.operand)
        if isinstance(node, ast.BoolOp):
            values = [self.value(v) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _OPS:
            return _OPS[type(node.ops[0])](self.value(node.left), self.value(node.comparators[0]))
        raise Unknown
