"""How kept statements are laid out: a statement that ruff spread over lines joins onto one (filled at LINE_LENGTH),
and def lines lose their annotations."""

from __future__ import annotations

import ast
import io
import tokenize
from typing import List, Optional, Set

LINE_LENGTH = 120
"""Longest line a statement is joined onto."""
NOT_REPRODUCED = (
    'raise RuntimeError("not reproduced: no error above (the script keeps the lines that ran when it did)")'
)
"""Appended after the statement that raised in the traced run; its continuation is not in the script."""
RAISED_HERE = "  # <- raised here in the traced run"
"""Marks the innermost statement of the script in the traced run's traceback."""


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip())


def _start(node: ast.stmt) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def one_line(source: str, lead: str, skip_last: bool = False) -> Optional[List[str]]:
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
        lead = chunk[0][: indent_of(chunk[0])]
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
            lead = chunk[0][: indent_of(chunk[0])]
            joined = one_line("\n".join(x[len(lead) :] for x in chunk), lead)
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


def signature_annotations(tree: ast.AST, lines: List[str]) -> Set[int]:
    """ids of the nodes in functions' argument and return annotations that layout.plain_defs drops (it keeps a
    signature with a comment as written), so the names they read need no definition (a dataclass field's annotation
    stays, and counts)."""
    out: Set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any("#" in x for x in lines[fn.lineno - 1 : _start(fn.body[0]) - 1]):
                continue
            a = fn.args
            notes = [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x]
            for note in [n for n in notes + [fn.returns] if n is not None]:
                out |= {id(n) for n in ast.walk(note)}
    return out
