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
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from fsdp_matrix.export.fold import Folder, Unknown
from fsdp_matrix.export.inline import _bound, _start
from fsdp_matrix.export.inliner import inline_all, inline_expressions
from fsdp_matrix.export.layout import NOT_REPRODUCED, RAISED_HERE, one_line, signature_annotations
from fsdp_matrix.export.simplify import constant_args, fold_tables, pure_functions, simplify
from fsdp_matrix.export.tidy import drop_unused_keywords, tidy, unused_params
from fsdp_matrix.export.trigger import trigger


@dataclass
class Trace:
    """What one traced run of the script executed (trace.py)."""

    lines: Set[int]
    """Line numbers of the script that ran on any rank."""
    raised: List[List[int]] = field(default_factory=list)
    """Per rank that raised: the script's line numbers in its traceback, outermost first."""
    outcome: str = ""
    """Rank 0's ``===== outcome:`` line."""
    checks: bool = True
    """Whether the traced script ran the matrix's checks (``RUN_CHECKS``; see export/cli.py)."""


def _is_doc(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


class _Emitter:
    """Writes statements back as their (folded) source lines, minus what never runs."""

    def __init__(self, lines: List[str], folder: Folder, trace: Optional[Trace]) -> None:
        self.lines, self.folder, self.trace = lines, folder, trace
        self.ran_lines: Optional[Set[int]] = trace.lines if trace else None
        self.stop_after: Set[int] = set()
        self.raised_here: Set[int] = set()
        self._innermost: Dict[int, ast.stmt] = {}
        self._function: Dict[int, ast.AST] = {}
        """id of a node -> the innermost function it is in."""

    def _stop_point(self, frames: List[int]) -> Set[int]:
        # the innermost frame whose statement is not a return or raise: the error would have ended it there
        for lineno in reversed(frames):
            node = self._innermost.get(lineno)
            if node is not None and not isinstance(node, (ast.Return, ast.Raise)):
                return set() if self._completed(node) else {id(node)}
        return set()

    def _completed(self, node: ast.stmt) -> bool:
        """The statement also ran to its end in another call (a forward before wrapping, then the same forward
        raising after): a line after it in its function ran outside the error path (except/finally), so the
        lines that follow are in the script and a stop there would fail the call that succeeded."""
        fn = self._function.get(id(node))
        if fn is None or self.trace is None:
            return False
        error_path: Set[int] = set()
        for sub in ast.walk(fn):
            if isinstance(sub, ast.Try):
                for part in [*sub.handlers, *sub.finalbody]:
                    error_path.update(range(part.lineno, part.end_lineno + 1))
        after = range(node.end_lineno + 1, fn.end_lineno + 1)
        return any(n in self.trace.lines and n not in error_path for n in after)

    def index(self, tree: ast.Module) -> None:
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(fn):  # nested defs are walked later and overwrite: the innermost wins
                    self._function[id(sub)] = fn
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
            out = one_line("\n".join(x[len(lead) :] for x in out) + "\n    pass", lead, skip_last=True) or out
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
            out = one_line("\n".join(x[len(lead) :] for x in out), lead) or out
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
                except Unknown:
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


def _names(text: str) -> List[str]:
    """Names a piece of code reads, in reading order (deduplicated)."""
    tree = ast.parse(text)
    skip = signature_annotations(tree, text.splitlines())
    found = sorted(
        ((n.lineno, n.col_offset, n.id) for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in skip),
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
    folder = Folder(tree, params)
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
        pure, args, unused = pure_functions(by_name), constant_args(by_name), unused_params(by_name)
        flags = _flags(order, binders)
        changed = False
        for node in functions:
            text = drop_unused_keywords(texts[id(node)], unused, pure)
            new = tidy(simplify(text, pure, args.get(node.name), flags))
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
    return Pruned(text, names, kept, trigger([emit(n) for n in order], api))


def _flags(order: List[ast.stmt], binders: Dict[str, ast.stmt]) -> Dict[str, bool]:
    """Top-level ``NAME = True``/``False`` statements that are NAME's only binding (``RUN_CHECKS``)."""
    out: Dict[str, bool] = {}
    for node in order:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, bool) and binders[name] is node:
                out[name] = node.value.value
    return out


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
