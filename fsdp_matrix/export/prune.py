"""Cut the inlined body of an exported script down to what its cell reaches, keeping comments and layout.

- Params fold into constants: ``params["k"]``, ``params.get("k", d)``, ``"k" in params`` and helper calls such as
  ``axis(params, "k", default=d)`` (any call whose first two arguments are ``params`` and a key) become the cell's
  value, in every function that takes the cell's ``params`` (an argument annotated as a dict or Mapping, never
  reassigned). A helper called otherwise stays as written: opaque, its definition kept when reached.
- Branches: an ``if``/``elif`` whose test folds to a constant keeps the branch it selects. With a ``Trace`` (the lines
  that ran on any rank, see trace.py), a statement or branch that never ran is dropped too, and right after the
  statement that raised the error a line stops a run where it did not raise: the lines after it were never kept.
- Reachability: only top-level statements whose names the kept code reads, from ``run`` and the runtime, survive;
  ``run`` comes first, then what it reaches in reading order (definitions a class or constant needs at import come
  before it).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from fsdp_matrix.export.inline import _bound, _start
from fsdp_matrix.export.inliner import inline_all, inline_expressions
from fsdp_matrix.export.simplify import constant_args, fold_tables, pure_functions, simplify

NOT_REPRODUCED = (
    'raise RuntimeError("not reproduced: no error above (the script keeps the lines that ran when it did)")'
)
"""Appended after the statement that raised in the traced run; its continuation is not in the script."""
RAISED_HERE = "  # <- raised here in the traced run"
"""Marks the innermost statement of the script in the traced run's traceback."""


LINE_LENGTH = 120
"""Longest line a statement is joined onto."""


@dataclass
class Trace:
    """What one traced run of the script executed (trace.py)."""

    lines: Set[int]
    """Line numbers of the script that ran on any rank."""
    raised: List[List[int]] = field(default_factory=list)
    """Per rank that raised: the script's line numbers in its traceback, outermost first."""
    outcome: str = ""
    """Rank 0's ``===== outcome:`` line."""


class _Unknown(Exception):
    pass


_OPS = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
}


class _Folder:
    """Finds the foldable params lookups of the script and evaluates constant tests over them."""

    def __init__(self, tree: ast.Module, params: Dict[str, Any]) -> None:
        self.params = params
        self.values: Dict[int, Any] = {}  # id(node) -> folded value
        self.spans: Dict[int, List[Tuple[int, int, str]]] = {}  # line -> (col, end_col, replacement)
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
            return True, self.params[key(args[0])]
        default = args[1] if len(args) > 1 else next((k.value for k in node.keywords if k.arg == "default"), None)
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
        """The constant a test evaluates to; _Unknown when it does not fold."""
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
        raise _Unknown


def _is_doc(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


class _Emitter:
    """Writes statements back as their (folded) source lines, minus what never runs."""

    def __init__(self, lines: List[str], folder: _Folder, trace: Optional[Trace]) -> None:
        self.lines, self.folder, self.trace = lines, folder, trace
        self.ran_lines: Optional[Set[int]] = trace.lines if trace else None
        self.stop_after: Set[int] = set()
        self.raised_here: Set[int] = set()
        self._innermost: Dict[int, ast.stmt] = {}

    def _stop_point(self, frames: List[int]) -> Set[int]:
        # the innermost frame whose statement is not a return or raise: the error would have ended it there
        for lineno in reversed(frames):
            node = self._innermost.get(lineno)
            if node is not None and not isinstance(node, (ast.Return, ast.Raise)):
                return {id(node)}
        return set()

    def index(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.stmt) and not hasattr(node, "body"):
                for lineno in range(node.lineno, node.end_lineno + 1):
                    self._innermost[lineno] = node
        for frames in self.trace.raised if self.trace else []:
            self.stop_after |= self._stop_point(frames)
            node = self._innermost.get(frames[-1]) if frames else None
            if node is not None:
                self.raised_here.add(id(node))

    def ran(self, node: ast.AST) -> bool:
        if self.ran_lines is None:
            return True
        return any(n in self.ran_lines for n in range(node.lineno, node.end_lineno + 1))

    def raw(self, first: int, last: int, dedent: int) -> List[str]:
        return [line[min(dedent, _indent(line)) :] for line in self.lines[first - 1 : last]]

    def header(self, node: ast.stmt, first_child: ast.stmt, dedent: int) -> List[str]:
        out = self.raw(_start(node), _start(first_child) - 1, dedent)
        while out and (not out[-1].strip() or out[-1].lstrip().startswith("#")):
            out.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(out) > 1:
            lead = out[0][: _indent(out[0])]
            out = _one_line("\n".join(x[len(lead) :] for x in out) + "\n    pass", lead, skip_last=True) or out
        return out

    def leading(self, node: ast.stmt, dedent: int) -> List[str]:
        first = _start(node)
        while first > 1 and self.lines[first - 2].lstrip().startswith("#"):
            first -= 1
        return self.raw(first, _start(node) - 1, dedent)

    def block(self, body: Sequence[ast.stmt], dedent: int, indent: str, cls: bool = False) -> List[str]:
        out: List[str] = []
        for node in body:
            if _is_doc(node):
                continue
            defn = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if cls:  # a class body ran at import, untraced: its methods count by their own bodies
                if defn and self.ran_lines is not None and not self.ran_body(node):
                    continue
            elif not self.ran(node):
                continue
            saved = self.ran_lines
            if defn and not cls:  # defined while the function ran, maybe called elsewhere: kept whole
                self.ran_lines = None
            try:
                out += self.leading(node, dedent) + self.stmt(node, dedent)
            finally:
                self.ran_lines = saved
        return out or [indent + "pass"]

    def ran_body(self, fn: ast.AST) -> bool:
        return any(self.ran(s) for s in fn.body if not _is_doc(s))

    def stmt(self, node: ast.stmt, dedent: int) -> List[str]:
        inner = " " * (node.col_offset - dedent + 4)
        if isinstance(node, ast.If):
            return self.if_chain(node, dedent)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            cls = isinstance(node, ast.ClassDef)
            return self.header(node, node.body[0], dedent) + self.block(node.body, dedent, inner, cls=cls)
        if isinstance(node, ast.Try):
            kept = [h for h in node.handlers if self.ran_lines is None or self.ran_body(h)]
            orelse = node.orelse if self.ran_lines is None or any(self.ran(s) for s in node.orelse) else []
            if not kept and not orelse and not node.finalbody:  # no handler ever ran: the body alone, one level out
                return self.block(node.body, dedent + 4, inner[4:])
            lead = " " * (node.col_offset - dedent)
            out = [lead + "try:"] + self.block(node.body, dedent, inner)
            for h in kept:
                out += self.header(h, h.body[0], dedent) + self.block(h.body, dedent, inner)
            if orelse:
                out += [lead + "else:"] + self.block(orelse, dedent, inner)
            if node.finalbody:
                out += [lead + "finally:"] + self.block(node.finalbody, dedent, inner)
            return out
        if isinstance(node, (ast.For, ast.While, ast.With)) and not getattr(node, "orelse", None):
            return self.header(node, node.body[0], dedent) + self.block(node.body, dedent, inner)
        out = self.raw(_start(node), node.end_lineno, dedent)
        if len(out) > 1:
            lead = out[0][: _indent(out[0])]
            out = _one_line("\n".join(x[len(lead) :] for x in out), lead) or out
        if id(node) in self.raised_here:
            out[-1] += RAISED_HERE
        if id(node) in self.stop_after and not hasattr(node, "body"):
            out.append(" " * (node.col_offset - dedent) + NOT_REPRODUCED)
        return out

    def if_chain(self, node: ast.If, dedent: int) -> List[str]:
        branches: List[Tuple[Optional[ast.If], List[ast.stmt]]] = []
        cur: Any = node
        while True:
            branches.append((cur, cur.body))
            nxt = cur.orelse
            elif_ = (
                len(nxt) == 1 and isinstance(nxt[0], ast.If) and self.lines[nxt[0].lineno - 1].lstrip()[:4] == "elif"
            )
            if elif_:
                cur = nxt[0]
                continue
            if nxt:
                branches.append((None, nxt))
            break
        kept: List[Tuple[Optional[ast.If], List[ast.stmt]]] = []
        for test, body in branches:
            if test is not None:
                try:
                    truth: Optional[bool] = bool(self.folder.value(test.test))
                except _Unknown:
                    truth = None
                if truth is False:
                    continue
            if self.ran_lines is not None and not any(self.ran(s) for s in body):
                continue
            kept.append((test, body))
            if test is not None and truth:
                kept[-1] = (None, body)  # always taken: no test, and nothing after it can run
                break
        inner = " " * (node.col_offset - dedent + 4)
        if not kept:
            return []
        if kept[0][0] is None:  # the only branch left runs unconditionally
            return self.block(kept[0][1], dedent + 4, inner[4:])
        out: List[str] = []
        for i, (test, body) in enumerate(kept):
            if test is None:
                out.append(" " * (node.col_offset - dedent) + "else:")
            else:
                head = self.header(test, body[0], dedent)
                word = "if" if i == 0 else "elif"
                lead = " " * (node.col_offset - dedent)
                head[0] = lead + word + head[0].lstrip()[2 if head[0].lstrip().startswith("if") else 4 :]
                out += head
            out += self.block(body, dedent, inner)
        return out


def _one_line(source: str, lead: str, skip_last: bool = False) -> Optional[List[str]]:
    """A statement spread over lines, unparsed onto one (its def line only, with ``skip_last``) when that fits in
    LINE_LENGTH and no comment would be lost; None otherwise."""
    if "#" in source:
        return None
    try:
        text = ast.unparse(ast.parse(source))
    except SyntaxError:
        return None
    lines = text.splitlines()[:-1] if skip_last else text.splitlines()
    if len(lines) != 1 + sum(1 for x in lines if x.startswith("@")):
        return None
    filled = _fill(lines[-1], lead)
    return [lead + x for x in lines[:-1]] + filled if filled else None


def plain_defs(text: str) -> str:
    """``text`` with every ``def`` line written without annotations (and joined onto one line where it fits): a
    repro's reader needs the names, and the annotations would keep typing imports alive."""
    lines = text.splitlines()
    defs = [n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for node in sorted(defs, key=lambda n: n.lineno, reverse=True):
        first, last = node.lineno, _start(node.body[0]) - 1
        while last > first and (not lines[last - 1].strip() or lines[last - 1].lstrip().startswith("#")):
            last -= 1
        chunk = lines[first - 1 : last]
        if any("#" in x for x in chunk):
            continue
        lead = chunk[0][: _indent(chunk[0])]
        stub = ast.parse("\n".join(x[len(lead) :] for x in chunk) + "\n    pass").body[0]
        for arg in ast.walk(stub.args):
            if isinstance(arg, ast.arg):
                arg.annotation = None
        stub.returns, stub.decorator_list = None, []
        head = _fill(ast.unparse(stub).splitlines()[0], lead)
        if head:
            lines[first - 1 : last] = head
    return "\n".join(lines)


def join_statements(text: str) -> str:
    """``text`` with each simple statement that spans lines joined as ``_one_line`` would (the runtime's sections
    are written for ruff, with one argument a line)."""
    lines = text.splitlines()
    stmts = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.stmt) and not hasattr(n, "body")]
    for node in sorted(stmts, key=lambda n: n.lineno, reverse=True):
        if node.end_lineno > node.lineno:
            chunk = lines[node.lineno - 1 : node.end_lineno]
            lead = chunk[0][: _indent(chunk[0])]
            joined = _one_line("\n".join(x[len(lead) :] for x in chunk), lead)
            if joined:
                lines[node.lineno - 1 : node.end_lineno] = joined
    return "\n".join(lines)


def _fill(line: str, lead: str) -> Optional[List[str]]:
    """``line`` broken after the commas of its outermost brackets so that every piece fits, continuation lines
    indented by four; None when a piece is still too long."""
    if len(lead + line) <= LINE_LENGTH:
        return [lead + line]
    cuts, depth = [], 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line).readline):
            if tok.type == tokenize.OP and tok.string in "([{":
                depth += 1
            elif tok.type == tokenize.OP and tok.string in ")]}":
                depth -= 1
            elif tok.type == tokenize.OP and tok.string == "," and depth == 1:
                cuts.append(tok.end[1])
    except tokenize.TokenError:
        return None
    out, start, width = [], 0, LINE_LENGTH - len(lead)
    for i, cut in enumerate(cuts + [len(line)]):
        nxt = cuts[i + 1] if i + 1 < len(cuts) else len(line)
        indent = "" if not out else "    "
        if len(indent + line[start:nxt].strip()) > width or cut == len(line):
            out.append(indent + line[start:cut].strip())
            start = cut
    if start < len(line):
        out.append("    " + line[start:].strip())
    if any(len(lead + x) > LINE_LENGTH for x in out):
        return None
    return [lead + x for x in out]


def _names(text: str) -> List[str]:
    """Names a piece of code reads, in reading order (deduplicated)."""
    tree = ast.parse(text)
    found = sorted(
        ((n.lineno, n.col_offset, n.id) for n in ast.walk(tree) if isinstance(n, ast.Name)),
        key=lambda t: (t[0], t[1]),
    )
    return list(dict.fromkeys(name for _, _, name in found))


def _eval_time_names(node: ast.stmt) -> Set[str]:
    """Names a top-level statement reads while it is executed (not later, when a function it defines is called)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        parts: List[ast.AST] = node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d]
    elif isinstance(node, ast.ClassDef):
        parts = node.decorator_list + node.bases + [k.value for k in node.keywords]
        for s in node.body:
            parts += _eval_time_parts(s)
    else:
        parts = [node]
    return {n.id for p in parts for n in ast.walk(p) if isinstance(n, ast.Name)}


def _eval_time_parts(node: ast.stmt) -> List[ast.AST]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d]
    return [node]


@dataclass
class Pruned:
    """The kept body and what it needs from the rest of the script."""

    text: str
    """Kept top-level statements, ``run`` first, one blank line apart."""
    names: Set[str]
    """Every name the kept body reads (to prune unused imports)."""
    kept: List[str]
    """Top-level names kept, in order."""
    trigger: List[str] = field(default_factory=list)
    """The kept statements that call ``api`` names, and the one that raised, in reading order from ``run``:
    ``(function) statement`` lines."""


def prune_body(
    script: str,
    body: Tuple[int, int],
    roots: Sequence[str],
    params: Dict[str, Any],
    trace: Optional[Trace] = None,
    api: Set[str] = frozenset(),
) -> Pruned:
    """Prune the top-level statements of ``script`` between lines ``body`` (first, last; 1-based, inclusive).

    ``roots``: names the rest of the script reads (``run`` first). Line numbers in ``trace`` are the script's.
    ``api``: names whose calls make the trigger (PEFT config, FSDP wrapping).
    """
    tree = ast.parse(script)
    folder = _Folder(tree, params)
    emitter = _Emitter(folder.apply(script.splitlines()), folder, trace)
    emitter.index(tree)
    stmts = [n for n in tree.body if body[0] <= n.lineno <= body[1] and not _is_doc(n)]
    binders: Dict[str, ast.stmt] = {}
    for node in stmts:
        for name in _bound(node):
            binders.setdefault(name, node)
    texts: Dict[int, str] = {}

    def emit(node: ast.stmt) -> str:
        if id(node) not in texts:
            never_ran = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not emitter.ran_body(node)
            saved = emitter.ran_lines
            if never_ran or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                # reached but never called (or run at import): kept whole, only the params folded
                emitter.ran_lines = None
            try:
                texts[id(node)] = "\n".join(emitter.leading(node, 0) + emitter.stmt(node, 0))
            finally:
                emitter.ran_lines = saved
        return texts[id(node)]

    def walk() -> Tuple[List[ast.stmt], Set[str]]:
        order: List[ast.stmt] = []
        seen: Set[int] = set()
        pending = [binders[n] for n in roots if n in binders]
        names: Set[str] = set()
        while pending:  # breadth by reading order: run, then what it reads first
            node = pending.pop(0)
            if id(node) in seen:
                continue
            seen.add(id(node))
            order.append(node)
            read = _names(emit(node))
            names |= set(read)
            pending += [binders[n] for n in read if n in binders and id(binders[n]) not in seen]
        return order, names

    order, names = walk()
    for _ in range(10):  # simplifying drops calls, which can leave functions unreached, which frees more
        functions = [n for n in order if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        by_name = {n.name: texts[id(n)] for n in functions}
        pure, args = pure_functions(by_name), constant_args(by_name)
        changed = False
        for node in functions:
            new = simplify(texts[id(node)], pure, args.get(node.name))
            changed |= new != texts[id(node)]
            texts[id(node)] = new
        inlined = inline_all({n.name: texts[id(n)] for n in functions}, keep=set(roots))
        inlined = inline_expressions(inlined)
        tables = _tables([texts[id(n)] for n in order if isinstance(n, ast.Assign)])
        inlined = {name: fold_tables(text, tables) for name, text in inlined.items()}
        for node in functions:
            if node.name in inlined and inlined[node.name] != texts[id(node)]:
                texts[id(node)] = inlined[node.name]
                changed = True
        order, names = walk()
        if not changed:
            break
    seen = {id(n) for n in order}
    final: List[ast.stmt] = []
    placed: Set[int] = set()

    def place(node: ast.stmt, stack: Tuple[int, ...] = ()) -> None:
        if id(node) in placed or id(node) in stack:
            return
        for name in sorted(_eval_time_names(node)):
            dep = binders.get(name)
            if dep is not None and dep is not node and id(dep) in seen:
                place(dep, stack + (id(node),))
        placed.add(id(node))
        final.append(node)

    for node in order:
        place(node)
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    plain = {id(n) for n in final if not isinstance(n, defs)}
    # constants that need no definition to be evaluated go first, together: the flow of functions stays unbroken
    plain = {
        i
        for i in plain
        if not any(
            id(binders.get(name)) in seen - plain for name in _eval_time_names(next(n for n in final if id(n) == i))
        )
    }
    consts = sorted((n for n in final if id(n) in plain), key=lambda n: n.lineno)
    flow = [n for n in final if id(n) not in plain]
    kept = [name for node in consts + flow for name in sorted(_bound(node))]
    text = "\n".join(emit(n) for n in consts) + ("\n\n" if consts else "") + "\n\n".join(emit(n) for n in flow)
    return Pruned(text, names, kept, _trigger([emit(n) for n in order], api))


def _tables(texts: List[str]) -> Dict[str, Dict[Any, str]]:
    """Module-level dict literals with constant keys: name -> key -> the value's source (names and attributes
    only, e.g. ``torch.bfloat16``)."""
    out: Dict[str, Dict[Any, str]] = {}
    for text in texts:
        node = ast.parse(text).body[-1]
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        if isinstance(node.value, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.value.keys):
            values = node.value.values
            if all(isinstance(v, (ast.Name, ast.Attribute, ast.Constant)) for v in values):
                out[node.targets[0].id] = {k.value: ast.unparse(v) for k, v in zip(node.value.keys, values)}
    return out


def _trigger(texts: List[str], api: Set[str]) -> List[str]:
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
    return isinstance(stmt, ast.Raise) and "not reproduced" in ast.unparse(stmt)


def _root(node: ast.AST) -> str:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def prune_imports(lines: Sequence[str], used: Set[str]) -> List[str]:
    """Import lines with the aliases nothing reads removed (``from __future__`` kept)."""
    out = []
    for line in lines:
        node = ast.parse(line).body[0]
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            out.append(line)
            continue
        keep = [a for a in node.names if (a.asname or a.name).split(".")[0] in used]
        if not keep:
            continue
        node.names = keep
        out.append(ast.unparse(node))
    return out
