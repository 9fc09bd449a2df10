"""Inline a repro and the fsdp_matrix modules it imports into one flat script body, with ``ast``.

The workload modules are written for this: they import only the standard library, third-party packages, each other
and ``fsdp_matrix.errors``, always as top-level ``from fsdp_matrix.x import a, b``. Each module's text is kept as
written (docstrings and comments explain the report), minus its imports: third-party and stdlib imports are hoisted
into one deduplicated header, ``fsdp_matrix`` imports are dropped (their names are defined earlier in the script,
since modules come in dependency order). A name bound by two inlined modules would silently take one meaning in the
flat script, so it is an error, as is any import this scheme cannot flatten.
"""

from __future__ import annotations

import ast
import functools
import graphlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from fsdp_matrix.errors import MatrixError

PACKAGE = "fsdp_matrix"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
INLINABLE = ("fsdp_matrix.workload", "fsdp_matrix.export.launch", "fsdp_matrix.export.rank", "fsdp_matrix.export.train")
"""Modules inlined whole (with every submodule)."""
PICK_ONLY = ("fsdp_matrix.errors",)
"""Modules from which only the imported top-level definitions are inlined (the rest is harness, not repro)."""


class InlineError(MatrixError):
    """A module cannot be flattened into one script; the message names the module and the statement."""


@dataclass
class Section:
    """One inlined module: its path, its text without imports, and the names it binds at top level."""

    module: str
    """Dotted name, e.g. ``fsdp_matrix.workload.models``; the repro's file stem for the repro itself."""
    path: Path
    """Source file."""
    text: str = ""
    """Module source minus hoisted and dropped imports (and the repro's ``__main__`` block)."""
    binds: Set[str] = field(default_factory=set)
    """Top-level names it defines (functions, classes, assignments, imports kept in place)."""
    needs: List[str] = field(default_factory=list)
    """fsdp_matrix modules it imports from."""


@dataclass
class Flat:
    """The whole inlined body, ready to be written after a script header."""

    stdlib_imports: List[str]
    """Hoisted ``import``/``from`` lines of standard-library modules (``__future__`` excluded)."""
    other_imports: List[str]
    """Hoisted third-party import lines (torch, peft, ...)."""
    sections: List[Section]
    """Inlined modules in dependency order, the repro last."""


def module_file(module: str) -> Path:
    rel = Path(*module.split(".")[1:])
    pkg = PACKAGE_ROOT / rel / "__init__.py"
    return pkg if pkg.exists() else PACKAGE_ROOT / rel.with_suffix(".py")


def is_stdlib(module: str) -> bool:
    top = module.split(".")[0]
    names = getattr(sys, "stdlib_module_names", None)
    if names is not None:
        return top in names
    import importlib.util  # Python < 3.10: decide by where the module lives
    import sysconfig

    spec = importlib.util.find_spec(top)
    origin = getattr(spec, "origin", None) or ""
    return origin in ("built-in", "frozen") or origin.startswith(sysconfig.get_paths()["stdlib"])


def _start(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators])


def _bound(node: ast.AST) -> Set[str]:
    """Names a top-level statement binds in the module namespace (not inside functions or classes)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        targets += [i.optional_vars for i in getattr(node, "items", []) if i.optional_vars is not None]
        out = {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}
        return out | {n for s in getattr(node, "body", []) for n in _bound(s)}
    out: Set[str] = set()
    for attr in ("body", "orelse", "finalbody", "handlers"):
        for child in getattr(node, attr, []) or []:
            out |= _bound(child)
    return out


def _is_main_guard(node: ast.stmt) -> bool:
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
    )


def _owned(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


FACADE = PACKAGE + ".case"
"""The case API's facade: a repro may import from it; the script takes each name from its home module."""


def _facade_module(tree: ast.Module) -> Tuple[List[ast.stmt], Dict[int, str]]:
    """``from fsdp_matrix import case`` as ``from fsdp_matrix.case import`` the names the module reads as ``case.x``,
    and the line that binds ``case`` to a namespace of them (keyed by the import's line number)."""
    out: List[ast.stmt] = []
    spaces: Dict[int, str] = {}
    for node in tree.body:
        names = [(a.name, a.asname) for a in getattr(node, "names", [])]
        if not (isinstance(node, ast.ImportFrom) and node.module == PACKAGE and names == [("case", names[0][1])]):
            out.append(node)
            continue
        bound = names[0][1] or "case"
        read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == bound}
        facade = _facade_homes()
        used = sorted(n for n in read if facade.get(n) != PACKAGE + ".standalone")  # the main guard is dropped
        for new in (ast.Import(names=[ast.alias("types")]), ast.ImportFrom(FACADE, [ast.alias(n) for n in used], 0)):
            out.append(ast.copy_location(new, node))
            out[-1].end_lineno = node.end_lineno
        spaces[node.lineno] = f"{bound} = types.SimpleNamespace({', '.join(f'{n}={n}' for n in used)})"
    return out, spaces


def _facade_homes() -> Dict[str, str]:
    """Each name the facade exports, with the module it imports it from."""
    facade = ast.parse(module_file(FACADE).read_text(encoding="utf-8"))
    return {a.asname or a.name: n.module for n in facade.body if isinstance(n, ast.ImportFrom) for a in n.names}


def _through_facade(body: Sequence[ast.stmt]) -> List[ast.stmt]:
    """``from fsdp_matrix.case import a, b`` as the imports of ``a`` and ``b`` from their home modules (read from the
    facade's own imports), so that a repro written against the facade inlines like one that imports the modules."""
    out: List[ast.stmt] = []
    home: Dict[str, str] = {}
    for node in body:
        if not (isinstance(node, ast.ImportFrom) and node.module == FACADE):
            out.append(node)
            continue
        home = home or _facade_homes()
        groups: Dict[str, List[ast.alias]] = {}
        for alias in node.names:
            if alias.name not in home:
                raise InlineError(f"{FACADE} does not import {alias.name} from a module the export can inline")
            if home[alias.name] == PACKAGE + ".standalone":
                continue  # the script's own runtime runs it; the standalone entry point is not inlined
            groups.setdefault(home[alias.name], []).append(alias)
        for mod, names in groups.items():
            out.append(ast.copy_location(ast.ImportFrom(module=mod, names=names, level=0), node))
            out[-1].end_lineno = node.end_lineno
    return out


def _check_inlinable(module: str, where: str) -> None:
    if not any(module == m or module.startswith(m + ".") for m in INLINABLE + PICK_ONLY):
        raise InlineError(f"{where}: imports {module}, which is harness code, not inlinable into a repro script")


class _Collector:
    """Walks the import graph from the repro and accumulates sections and hoisted imports."""

    def __init__(self) -> None:
        self.sections: Dict[str, Section] = {}
        self.picks: Dict[str, Set[str]] = {}
        self.imports: Dict[Tuple[bool, str], List[Tuple[str, Optional[str]]]] = {}
        self.bindings: Dict[str, Tuple[str, str]] = {}  # hoisted name -> (module, attribute) it refers to

    def hoist(self, node: ast.stmt, where: str) -> None:
        for alias in node.names:
            if isinstance(node, ast.Import):
                source, attr, name = alias.name, "", (alias.asname or alias.name.split(".")[0])
                key, item = (is_stdlib(alias.name), ""), (alias.name, alias.asname)
            else:
                source, attr, name = node.module, alias.name, alias.asname or alias.name
                key, item = (is_stdlib(node.module), node.module), (alias.name, alias.asname)
            if isinstance(node, ast.Import) and alias.asname is None:
                source = name  # ``import a.b`` binds ``a``
            # ``import torch.distributed as dist`` and ``from torch import distributed as dist`` bind one object
            dotted = ".".join(p for p in (source, attr) if p)
            previous = self.bindings.setdefault(name, (source, attr))
            if ".".join(p for p in previous if p) != dotted:
                theirs = ".".join(p for p in previous if p)
                raise InlineError(f"{where}: {name!r} is {dotted} here and {theirs} in another inlined module")
            items = self.imports.setdefault(key, [])
            if item not in items:
                items.append(item)

    def add(self, module: str, path: Path, wanted: Optional[Set[str]] = None, drop_main: bool = False) -> Section:
        if module in self.sections and wanted is None:
            return self.sections[module]
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(path))
        lines = source.splitlines()
        keep = [True] * len(lines)
        extra: Dict[int, str] = {}
        section = Section(module, path)
        body, spaces = _facade_module(tree)
        for node in _through_facade(body):
            where = f"{path.name}:{node.lineno}"
            first, last = _start(node) - 1, node.end_lineno
            if isinstance(node, ast.ImportFrom) and (node.module == "__future__" or node.level):
                if node.level:
                    raise InlineError(f"{where}: relative import; write `from {PACKAGE}.x import a`")
                keep[first:last] = [False] * (last - first)
            elif isinstance(node, ast.ImportFrom) and _owned(node.module):
                _check_inlinable(node.module, where)
                names = {a.name for a in node.names}
                if node.module in PICK_ONLY:
                    self.picks.setdefault(node.module, set()).update(names)
                elif node.module not in section.needs:
                    section.needs.append(node.module)
                self._provides(node.module, names, where)
                keep[first:last] = [False] * (last - first)
                aliases = [f"{a.asname} = {a.name}" for a in node.names if a.asname and a.asname != a.name]
                if aliases:
                    extra[first] = "\n".join([extra.get(first, "")] + aliases).lstrip("\n")
                    section.binds |= {a.asname for a in node.names if a.asname}
            elif isinstance(node, ast.Import) and any(_owned(a.name) for a in node.names):
                raise InlineError(f"{where}: `import {PACKAGE}...`; write `from {PACKAGE}.x import a` instead")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                self.hoist(node, where)
                keep[first:last] = [False] * (last - first)
            elif drop_main and _is_main_guard(node):
                keep[first:last] = [False] * (last - first)
            elif wanted is not None and not (_bound(node) & wanted):
                keep[first:last] = [False] * (last - first)
            else:
                section.binds |= _bound(node)
        for line, text in spaces.items():
            extra[line - 1] = "\n".join([extra.get(line - 1, ""), text]).lstrip("\n")
            section.binds.add(text.split(" ")[0])
        out = [extra.get(i, line) for i, line in enumerate(lines) if keep[i] or i in extra]
        section.text = _tidy("\n".join(out))
        self.sections[module] = section
        return section

    def _provides(self, module: str, names: Set[str], where: str) -> None:
        path = module_file(module)
        missing = sorted(names - _defined(str(path), path.stat().st_mtime_ns))
        if missing:
            raise InlineError(f"{where}: {module} does not define {', '.join(missing)}")


@functools.lru_cache(maxsize=256)
def _defined(path: str, mtime_ns: int) -> FrozenSet[str]:
    """The names a module's top level binds, read once per version of the file (``mtime_ns``): an export asks it
    for each import of each inlined module, about 90 times a script."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    return frozenset().union(*(_bound(n) for n in tree.body))


def _tidy(text: str) -> str:
    out: List[str] = []
    for line in text.strip("\n").splitlines():
        if not line.strip() and len(out) >= 2 and not out[-1].strip() and not out[-2].strip():
            continue
        out.append(line.rstrip())
    return "\n".join(out)


def _render_imports(imports: Dict[Tuple[bool, str], List[Tuple[str, Optional[str]]]], stdlib: bool) -> List[str]:
    plain = [
        f"import {n}" + (f" as {a}" if a else "")
        for (s, m), items in imports.items()
        if s == stdlib and not m
        for n, a in items
    ]
    froms = [
        f"from {m} import " + ", ".join(n + (f" as {a}" if a else "") for n, a in items)
        for (s, m), items in imports.items()
        if s == stdlib and m
    ]
    return sorted(plain) + sorted(froms)


def flatten(repro: Path, first: Sequence[str] = ()) -> Flat:
    """Inline ``first`` (whole modules, placed before everything else) and the repro with its dependencies."""
    col = _Collector()
    for module in first:
        _check_inlinable(module, "export")
        col.add(module, module_file(module))
    repro_section = col.add(repro.stem, repro, drop_main=True)
    pending = list(repro_section.needs)
    while pending:
        module = pending.pop()
        if module not in col.sections:
            pending += col.add(module, module_file(module)).needs
    picks = [col.add(m, module_file(m), wanted=names) for m, names in sorted(col.picks.items())]
    graph = graphlib.TopologicalSorter({s.module: s.needs for s in col.sections.values() if s.module not in first})
    order = [m for m in graph.static_order() if m != repro.stem and m not in col.picks]
    sections = [col.sections[m] for m in first] + picks + [col.sections[m] for m in order] + [repro_section]
    seen: Dict[str, str] = {n: "an import" for n in col.bindings}
    for section in sections:
        for name in sorted(section.binds):
            if name in seen:
                raise InlineError(
                    f"{section.path.name}: {name!r} is also bound by {seen[name]}: "
                    "one flat script cannot hold both; rename one"
                )
            seen[name] = section.path.name
    return Flat(_render_imports(col.imports, True), _render_imports(col.imports, False), sections)
