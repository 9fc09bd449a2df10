"""Second pass over the pruned functions of an exported script, on their own text (comments stay):

- a local assigned once, at the top of its function, to a constant (``orig = 1`` after params folding) is replaced
  by that constant where it is read, and ``None if 1 is None else bool(1)`` folds to ``True``;
- an assignment nothing reads any more (its reader was after the statement that raised, or in a dropped branch) is
  removed when its value is side-effect free: it only calls builtins, read-only methods and functions of the script
  that are themselves side-effect free (judged from their text, never from their name).

Removing a call can leave a function unreferenced; prune.py then drops it.
"""

from __future__ import annotations

import ast
from typing import Any, Dict, List, Optional, Set

PURE_BUILTINS = frozenset(
    "abs all any bool dict enumerate float frozenset getattr hasattr id int isinstance issubclass len list max min "
    "repr reversed set sorted str sum tuple type zip".split()
)
"""Builtins that only compute a value."""
READ_METHODS = frozenset(
    "parameters named_parameters modules named_modules buffers named_buffers children named_children items keys "
    "values get split rsplit strip replace startswith endswith lower upper join format copy "
    "perf_counter monotonic is_initialized".split()
)
"""Method names that read their object (torch modules, dicts, strings) without changing it, and clock reads."""
LOCAL_MUTATORS = frozenset("append extend add update insert".split())
"""Methods that change only their receiver: side-effect free when the receiver is a local of the function."""


class _NotConst(Exception):
    pass


FOLDABLE = (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.IfExp, ast.Call)
"""Expressions folded wherever they are constant (``'lora' == 'dora'``, ``bool(False)``), not only around a known
local: inlining leaves such expressions behind."""


def _const(node: ast.AST, known: Dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in known:
        return known[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _const(node.operand, known)
    if isinstance(node, ast.BoolOp):
        for sub in node.values[:-1]:
            value = _const(sub, known)
            if (not value) if isinstance(node.op, ast.And) else value:
                return value  # short-circuit: what follows is never evaluated
        return _const(node.values[-1], known)
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        left, right, op = _const(node.left, known), _const(node.comparators[0], known), node.ops[0]
        table = {ast.Eq: left == right, ast.NotEq: left != right, ast.Is: left is right, ast.IsNot: left is not right}
        if type(op) in table:
            return table[type(op)]
    if isinstance(node, ast.IfExp):
        return _const(node.body if _const(node.test, known) else node.orelse, known)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("bool", "int", "str"):
        if len(node.args) == 1 and not node.keywords:
            return {"bool": bool, "int": int, "str": str}[node.func.id](_const(node.args[0], known))
    raise _NotConst


def function_of(text: str) -> Optional[ast.FunctionDef]:
    """The top-level function that ``text`` defines (None when it is anything else)."""
    tree = ast.parse(text)
    fn = tree.body[0] if tree.body else None
    return fn if isinstance(fn, ast.FunctionDef) else None


def _stores(fn: ast.AST) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            counts[node.id] = counts.get(node.id, 0) + 1
        elif isinstance(node, ast.arg):
            counts[node.arg] = counts.get(node.arg, 0) + 2  # an argument is never a constant local
    return counts


def _locals(fn: ast.FunctionDef) -> Set[str]:
    return set(_stores(fn)) - {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}


FRESH = frozenset("torch.Generator torch.zeros torch.ones torch.empty torch.arange torch.tensor torch.full".split())
"""torch calls that only make a new object."""
SEEDED = frozenset("torch.randint torch.randn torch.rand torch.randperm".split())
"""torch calls that make a new tensor, and draw from the global RNG unless given a ``generator=``."""


def _fresh(call: ast.AST) -> bool:
    """A call that makes a new object and touches nothing else: a method called on it changes only that object."""
    if not isinstance(call, ast.Call):
        return False
    name = ast.unparse(call.func)
    return name in FRESH or (name in SEEDED and any(k.arg == "generator" for k in call.keywords))


def is_pure(node: ast.AST, pure: Set[str], local: Set[str]) -> bool:
    """Whether evaluating ``node`` only computes a value (see the module docstring)."""
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr, ast.Global, ast.Nonlocal)):
            return False
        if not isinstance(sub, ast.Call):
            continue
        func = sub.func
        if isinstance(func, ast.Name) and (func.id in PURE_BUILTINS or func.id in pure):
            continue
        if _fresh(sub) or (isinstance(func, ast.Attribute) and _fresh(func.value)):
            continue
        if isinstance(func, ast.Attribute) and func.attr in READ_METHODS:
            continue
        if isinstance(func, ast.Attribute) and func.attr in LOCAL_MUTATORS and isinstance(func.value, ast.Name):
            if func.value.id in local:
                continue
        return False
    return True


def _pure_function(fn: ast.FunctionDef, pure: Set[str]) -> bool:
    local = _locals(fn)
    for node in ast.walk(fn):
        if isinstance(node, (ast.Attribute, ast.Subscript)) and not isinstance(node.ctx, ast.Load):
            return False  # writes into an object it may not own
    return all(is_pure(stmt, pure, local) for stmt in fn.body)


def pure_functions(texts: Dict[str, str]) -> Set[str]:
    """Names of the top-level functions (name -> text) that are side-effect free; a greatest fixpoint, so mutually
    calling pure functions stay pure."""
    trees = {}
    for name, text in texts.items():
        node = ast.parse(text).body[0]
        if isinstance(node, ast.FunctionDef) and not node.decorator_list:
            trees[name] = node
    pure = set(trees)
    changed = True
    while changed:
        changed = False
        for name in sorted(pure):
            if not _pure_function(trees[name], pure):
                pure.discard(name)
                changed = True
    return pure


def _replace(lines: List[str], spans: List[tuple]) -> List[str]:
    out = list(lines)
    for lineno, col, end, rep in sorted(spans, reverse=True):
        text = out[lineno - 1].encode()
        out[lineno - 1] = (text[:col] + rep.encode() + text[end:]).decode()
    return out


def _drop(lines: List[str], stmts: List[ast.stmt]) -> List[str]:
    gone: Set[int] = set()
    for stmt in stmts:
        first = stmt.lineno
        while first > 1 and lines[first - 2].lstrip().startswith("#"):
            first -= 1  # its comment goes with it
        gone |= set(range(first, stmt.end_lineno + 1))
    return [line for i, line in enumerate(lines, 1) if i not in gone]


def constant_args(texts: Dict[str, str]) -> Dict[str, Dict[str, Any]]:
    """Per top-level function (name -> text): the parameters every call in ``texts`` passes the same constant (or
    leaves at a constant default). A function also used other than by a plain call (passed along, called from
    outside ``texts``) has none."""
    trees = {name: ast.parse(text) for name, text in texts.items()}
    fns = {n: t.body[0] for n, t in trees.items() if t.body and isinstance(t.body[0], ast.FunctionDef)}
    calls: Dict[str, List[ast.Call]] = {name: [] for name in fns}
    funcs = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in fns:
                calls[node.func.id].append(node)
                funcs.add(id(node.func))
    for tree in trees.values():
        fn = tree.body[0] if tree.body else tree
        shadowed = _locals(fn) if isinstance(fn, ast.FunctionDef) else set()
        shadowed |= {a.arg for a in ast.walk(fn) if isinstance(a, ast.arg)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in calls and id(node) not in funcs and node.id not in shadowed:
                calls.pop(node.id)  # passed along: callers unknown
    out: Dict[str, Dict[str, Any]] = {}
    for name, sites in calls.items():
        if sites:
            out[name] = _agreed(fns[name].args, sites)
    return {k: v for k, v in out.items() if v}


def _agreed(args: ast.arguments, sites: List[ast.Call]) -> Dict[str, Any]:
    positional = args.posonlyargs + args.args
    defaults = dict(zip([a.arg for a in positional][len(positional) - len(args.defaults) :], args.defaults))
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    names = [a.arg for a in positional + args.kwonlyargs]
    values: Dict[str, List[Any]] = {n: [] for n in names}
    for call in sites:
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            return {}
        bound = dict(zip([a.arg for a in positional], call.args))
        bound.update({k.arg: k.value for k in call.keywords})
        for n in names:
            node = bound.get(n, defaults.get(n))
            values[n].append(node.value if isinstance(node, ast.Constant) else _NotConst)
    return {
        n: v[0]
        for n, v in values.items()
        if v and v[0] is not _NotConst and all(x is not _NotConst and type(x) is type(v[0]) and x == v[0] for x in v)
    }


def _taken_branch(node: ast.AST, known: Dict[str, Any]) -> Optional[str]:
    """``a if TEST else b`` with a constant TEST: the source of the branch taken, when it reads no known name."""
    if not isinstance(node, ast.IfExp):
        return None
    try:
        branch = node.body if _const(node.test, known) else node.orelse
    except _NotConst:
        return None
    if any(isinstance(n, ast.Name) and n.id in known for n in ast.walk(branch)):
        return None
    return ast.unparse(branch)


def _fold_ifs(fn: ast.FunctionDef, lines: List[str], flags: Optional[Dict[str, bool]] = None) -> Optional[List[str]]:
    """The first ``if`` whose test is a constant, replaced by the branch it takes (``elif`` chains included);
    ``flags``: module-level booleans the function does not rebind (``RUN_CHECKS``)."""
    stores = _stores(fn)
    known = {n: v for n, v in (flags or {}).items() if n not in stores}
    for node in ast.walk(fn):
        if not isinstance(node, ast.If):
            continue
        try:
            taken = bool(_const(node.test, known))
        except _NotConst:
            continue
        elif_ = len(node.orelse) == 1 and lines[node.orelse[0].lineno - 1].lstrip().startswith("elif")
        first, last = node.lineno, node.end_lineno
        if taken:
            body = _dedent(lines[node.body[0].lineno - 1 : node.body[-1].end_lineno])
            return lines[: first - 1] + body + lines[last:]
        if elif_:
            nxt = node.orelse[0].lineno
            line = lines[nxt - 1]
            head = line[: _indent(line)] + line.lstrip()[2:]  # elif -> if
            return lines[: first - 1] + [head] + lines[nxt:]
        if node.orelse:
            return lines[: first - 1] + _dedent(lines[node.orelse[0].lineno - 1 : last]) + lines[last:]
        siblings = next(b for p in ast.walk(fn) for b in _blocks(p) if node in b)
        if len(siblings) > 1:
            return lines[: first - 1] + lines[last:]
    return None


def _blocks(node: ast.AST) -> List[list]:
    return [b for b in (getattr(node, f, None) for f in ("body", "orelse", "finalbody")) if isinstance(b, list)]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _dedent(lines: List[str]) -> List[str]:
    return [line[min(4, _indent(line)) :] for line in lines]


def _drop_overwritten(fn: ast.FunctionDef, lines: List[str]) -> Optional[List[str]]:
    """``x = CONSTANT`` that the next assignment to ``x`` overwrites before anything reads it (an inlined
    parameter default, then the value the cell sets)."""
    body = fn.body
    for i, stmt in enumerate(body):
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        if not isinstance(stmt.value, ast.Constant):
            continue
        name = stmt.targets[0].id
        for later in body[i + 1 :]:
            reads = any(
                isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in ast.walk(later)
            )
            if reads:
                break
            stores = [n for n in ast.walk(later) if isinstance(n, ast.Name) and n.id == name]
            if stores:
                plain = isinstance(later, ast.Assign) and len(later.targets) == 1 and later.targets[0] is stores[0]
                if plain:
                    return _drop(lines, [stmt])
                break
    return None


def _fold_locals(fn: ast.FunctionDef, lines: List[str], args: Optional[Dict[str, Any]] = None) -> Optional[List[str]]:
    stores, assigns = _stores(fn), []
    # a parameter every caller passes the same constant, unless the body rebinds it
    known = {n: v for n, v in (args or {}).items() if stores.get(n) == 2}
    for stmt in fn.body:
        if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
            continue
        target, value = stmt.targets[0], stmt.value
        pairs = [(target, value)] if isinstance(target, ast.Name) else []
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            pairs = list(zip(target.elts, value.elts))  # a, b = 1, 2: both or neither
        if not pairs or not all(isinstance(t, ast.Name) and stores.get(t.id) == 1 for t, _ in pairs):
            continue
        try:
            found = {t.id: _const(v, known) for t, v in pairs}
        except _NotConst:
            continue
        known.update(found)
        assigns.append(stmt)
    spans = []
    for node in ast.walk(fn):
        if isinstance(node, ast.expr) and not isinstance(node, ast.Constant) and node.lineno == node.end_lineno:
            if not isinstance(node, FOLDABLE) and not any(
                isinstance(n, ast.Name) and n.id in known for n in ast.walk(node)
            ):
                continue
            try:
                rep = repr(_const(node, known))
            except _NotConst:
                rep = _taken_branch(node, known)
                if rep is None:
                    continue
            span = (node.lineno, node.col_offset, node.end_col_offset, rep)
            if not any(s[0] == span[0] and s[1] <= span[1] and span[2] <= s[2] for s in spans):
                spans = [s for s in spans if not (s[0] == span[0] and span[1] <= s[1] and s[2] <= span[2])] + [span]
    assign_ids = {id(a) for a in assigns}
    loads = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.Name) and n.id in known and isinstance(n.ctx, ast.Load) and id(n) not in assign_ids
    ]
    if any(
        not any(s[0] == n.lineno and s[1] <= n.col_offset and n.end_col_offset <= s[2] for s in spans) for n in loads
    ):
        return None  # a read stays as written: keep every assignment (rare; never half-folded)
    new = _drop(_replace(lines, spans), assigns)
    return new if new != lines else None


def _drop_dead(fn: ast.FunctionDef, lines: List[str], pure: Set[str]) -> Optional[List[str]]:
    read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    # ``count += 1`` reads count: its first value must stay
    read |= {n.target.id for n in ast.walk(fn) if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)}
    local = _locals(fn)
    dead = []
    for node in ast.walk(fn):
        for block in (getattr(node, "body", None), getattr(node, "orelse", None)):
            if not isinstance(block, list) or len(block) < 2:
                continue  # never empty a block
            for stmt, after in zip(block, block[1:] + [None]):
                if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
                    continue
                if isinstance(after, ast.Raise):
                    continue  # the statement that raised in the traced run: kept, whatever it computes
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                names = [n for t in targets for n in ast.walk(t)]
                if not all(isinstance(n, (ast.Name, ast.Tuple, ast.Store)) for n in names):
                    continue
                if any(isinstance(n, ast.Name) and n.id in read for n in names):
                    continue
                if is_pure(stmt.value, pure, local):
                    dead.append(stmt)
    return _drop(lines, dead) if dead else None


def simplify(
    text: str, pure: Set[str], args: Optional[Dict[str, Any]] = None, flags: Optional[Dict[str, bool]] = None
) -> str:
    """One top-level function's text with constant locals (and the parameters in ``args``) folded, constant ``if``
    tests resolved and dead side-effect-free assignments removed."""
    for _ in range(10):
        tree = ast.parse(text)
        fn = tree.body[0] if tree.body else None
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return text
        lines = text.splitlines()
        new = (
            _fold_locals(fn, lines, args)
            or _fold_ifs(fn, lines, flags)
            or _drop_overwritten(fn, lines)
            or _drop_dead(fn, lines, pure)
        )
        args = None  # folded into the text: the parameters are no longer read
        if new is None:
            return text
        text = "\n".join(new)
    return text


def fold_tables(text: str, tables: Dict[str, Dict[Any, str]]) -> str:
    """``TABLE['key']`` (a module-level dict literal, see prune._tables) replaced by the value it holds, in a
    function that does not rebind TABLE."""
    fn = function_of(text)
    if fn is None:
        return text
    local = _locals(fn)
    spans = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id not in local:
            table = tables.get(node.value.id)
            key = node.slice
            if (
                table is not None
                and isinstance(key, ast.Constant)
                and key.value in table
                and node.lineno == node.end_lineno
            ):
                spans.append((node.lineno, node.col_offset, node.end_col_offset, table[key.value]))
    return "\n".join(_replace(text.splitlines(), spans)) if spans else text
