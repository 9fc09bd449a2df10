"""The exported repro script: one self-contained file that reproduces a cell.

The script carries a PEP 723 block with the combo's exact pins (``uv run repro_….py`` needs nothing else) and starts
itself on the cell's ranks with torchrun. Its body is the case's hand-written upstream script
(``repros/upstream/<repro>.py``: plain torch and PEFT calls) when one is written for the cell, else the repro with
the fsdp_matrix modules it imports, flattened (see inline.py) and run with the cell's params as constants. It names
no package index: uv and pip pick packages from the user's own index configuration.
"""

from __future__ import annotations

import ast
import datetime
import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from fsdp_matrix.cells import Cell, find_cell
from fsdp_matrix.errors import MatrixError
from fsdp_matrix.expectations import Expected, expected_for
from fsdp_matrix.export.inline import Section, flatten
from fsdp_matrix.matrix import Case, Combo, Matrix
from fsdp_matrix.records import Record, read_all

ENTRY = ("fsdp_matrix.export.launch", "fsdp_matrix.export.rank")
"""Inlined whole: the launcher (before torch is imported) and the rank side."""
UPSTREAM = "upstream"
"""The folder beside the repros that holds their hand-written upstream scripts."""
LINE_LENGTH = 120


@dataclass
class Export:
    """What one export is about: the cell, its case and combo, what matrix.yaml expects, and the newest record."""

    cell: Cell
    """The cell, resolved from matrix.yaml (device from the combo's tags)."""
    case: Case
    """Its case: title, report, repro path."""
    combo: Combo
    """The pinned versions the script requires."""
    expected: Expected
    """matrix.yaml's expectation for the cell under the combo's pins."""
    repro: Path
    """The case's repro script."""
    record: Optional[Record] = None
    """Newest record of this cell for this combo under --results, if any."""
    upstream: Optional[Path] = None
    """The hand-written upstream script whose ``CELLS`` name this cell; None: the repro is flattened."""

    @property
    def stem(self) -> str:
        return f"repro_{self.cell.case}_{self.cell.id}"

    @property
    def source(self) -> Path:
        """The file the script's body comes from."""
        return self.upstream or self.repro


def find_record(results: Path, cell: Cell, combo: Combo) -> Optional[Record]:
    """The newest record of ``cell`` run under ``combo``: recorded with its id, or (plain pytest runs record no combo)
    with exactly its pinned versions."""
    if not results.exists():
        return None
    pins = combo.pins.model_dump()

    def same(rec: Record) -> bool:
        if rec.key != cell.key or rec.device != cell.device:
            return False
        if rec.combo is not None:
            return rec.combo == combo.id
        return all((rec.versions.get(n) or "").split("+")[0] == v for n, v in pins.items())

    hits = [r for r in read_all(results) if same(r)]
    return max(hits, key=lambda r: r.finished_at) if hits else None


def upstream_cells(path: Path) -> List[str]:
    """The cell ids an upstream script's top-level ``CELLS`` tuple names (it is checked against each of them)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["CELLS"]:
            return list(ast.literal_eval(node.value))
    return []


def upstream_for(repro: Path, cell: Cell) -> Optional[Path]:
    path = repro.parent / UPSTREAM / repro.name
    return path if path.exists() and cell.id in upstream_cells(path) else None


# ---- the script -------------------------------------------------------------------------------------------------


def _pep723(combo: Combo) -> str:
    python = f"=={combo.python}.*" if combo.python else ">=3.9"
    rows: List[str] = []
    for req in combo.requirements():  # packed to the line length: the pins read as one sentence
        item = f'"{req}",'
        if rows and len(rows[-1]) + 1 + len(item) <= LINE_LENGTH:
            rows[-1] += " " + item
        else:
            rows.append("#   " + item)
    deps = "".join(row + "\n" for row in rows)
    return f'# /// script\n# requires-python = "{python}"\n# dependencies = [\n{deps}# ]\n# ///\n'


def _docstring(exp: Export, about: str) -> str:
    how = "hand-written upstream script" if exp.upstream else "repro and the fsdp_matrix/workload code it uses"
    head = exp.case.title if exp.upstream else f"{exp.case.title}: {exp.case.report}"  # its own text links it
    text = (
        f"{head}\n\n{about}\n\n"
        f"fsdp-matrix cell {exp.cell.key} (combo {exp.combo.id}, {exp.cell.world_size} ranks on {exp.cell.device}); "
        f"expected with the pinned versions: {expected_text(exp.expected)}. "
        f"Run `uv run {exp.stem}.py` or `python {exp.stem}.py`: it starts itself under torchrun (--device cpu|cuda, "
        f"--nproc-per-node N, --timeout S). Generated by `python -m fsdp_matrix export` on "
        f"{datetime.date.today().isoformat()} from the {how} ({exp.source.name})."
    )
    return '"""' + text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') + '\n"""\n'


def _drop_top(text: str, drop_docstring: bool = True, names: tuple = ("CELLS",)) -> str:
    """``text`` without its docstring and its ``names`` assignments (each with the docstring that follows it)."""
    tree = ast.parse(text)
    lines = text.splitlines()
    gone = set()
    for i, node in enumerate(tree.body):
        doc = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        after = i and isinstance(tree.body[i - 1], ast.Assign) and ast.unparse(tree.body[i - 1].targets[0]) in names
        assigns = isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) in names
        if (doc and (i == 0 and drop_docstring or after)) or assigns:
            gone |= set(range(node.lineno, node.end_lineno + 1))
    return "\n".join(x for n, x in enumerate(lines, 1) if n not in gone)


def _stdlib_lines(imports: List[str]) -> List[str]:
    """``import a`` lines joined into one ``import a, b`` line (a repro's reader skims them)."""
    plain = [x[len("import ") :] for x in imports if x.startswith("import ")]
    return ([f"import {', '.join(plain)}"] if plain else []) + [x for x in imports if not x.startswith("import ")]


def _join(parts: List[str]) -> str:
    # one blank line between definitions, not PEP 8's two: the script is read in an issue, on a screen
    text = "\n\n".join(p.strip("\n") for p in parts if p.strip()) + "\n"
    return re.sub(r"\n{3,}", "\n\n", text)


def _constants(exp: Export) -> str:
    return (
        f"PARAMS = {exp.cell.params_dict!r}\n"
        f"PINS = {exp.combo.pins.model_dump()!r}\n"
        f"DEVICE, WORLD_SIZE = {exp.cell.device!r}, {exp.cell.world_size!r}\n"
    )


GUARD = (
    'if __name__ == "__main__" and "RANK" not in os.environ:\n    sys.exit(relaunch(sys.argv[1:], DEVICE, WORLD_SIZE))'
)


def _main(context: str) -> str:
    # rank_main has printed (flushed) and written its outcome; gloo's threads can still abort the interpreter's
    # teardown ('terminate called without an active exception', SIGABRT: seen in a fresh-clone nox -s tests)
    return (
        'if __name__ == "__main__":  # os._exit: no teardown left to abort a rank after its outcome\n'
        f"    os._exit(rank_main(run, {context}, PARAMS, PINS, sys.argv[1:], DEVICE, WORLD_SIZE))"
    )


def render_script(exp: Export) -> str:
    """The script: PEP 723 block, docstring, imports, the launcher (run before torch is imported), third-party
    imports, the body (the upstream script, or the flattened repro), the rank side."""
    flat = flatten(exp.source, first=ENTRY)
    launch, rank, body = flat.sections[0], flat.sections[1], flat.sections[2:]
    own: Section = body[-1]
    about = ast.get_docstring(ast.parse(own.path.read_text(encoding="utf-8"))) or ""
    # the docstrings of the harness's own modules (export/train.py) say nothing about the report
    texts = [_drop_top(s.text) if s.module.startswith("fsdp_matrix.export") else s.text for s in body[:-1]]
    texts.append(_drop_top(own.text))
    context = "RankContext" if any("RankContext" in s.binds for s in body) else "Context"
    parts = [
        _pep723(exp.combo) + _docstring(exp, about) + "\nfrom __future__ import annotations",
        "\n".join(_stdlib_lines(flat.stdlib_imports)) + "\n\n" + _constants(exp),
        _drop_top(launch.text),
        GUARD,
        "# imported on the ranks only: the launching process stops above\n" + "\n".join(flat.other_imports),
        *texts,
        _drop_top(rank.text),
        _main(context),
    ]
    return _join(parts)


def expected_text(expected: Expected) -> str:
    if expected.kind == "error":
        where = f" raised in {expected.module}" if expected.module else ""
        return f"{expected.error_type} matching /{expected.match}/{where} (the reported failure)"
    if expected.kind == "ok":
        return "training passes every check (the fix or workaround holds)"
    return expected.describe()


def prepare(
    matrix: Matrix, ref: str, combo_id: Optional[str], results: Path, root: Path, releases: Optional[dict] = None
) -> Export:
    """Resolve the cell and combo; ``root`` is the directory that repro paths in matrix.yaml are relative to;
    ``releases`` (``--pin NAME==VERSION``) replace the combo's pins: the script installs them, and the expectation
    is matrix.yaml's under them (a bug that shows only on a release no combo pins)."""
    # --combo '' names no combo: an error, not the default
    combo = matrix.combo(combo_id) if combo_id is not None else matrix.newest("cpu")
    if releases:
        try:
            combo = combo.with_pins(**releases)
        except ValueError as exc:  # pydantic: a package the pins do not know
            raise MatrixError(f"--pin: {str(exc).splitlines()[-1].strip()}") from None
    device = "cuda" if "gpu" in combo.tags else "cpu"
    cell = find_cell(matrix, ref, device)
    case = matrix.case(cell.case)
    pins = combo.pins.model_dump()
    repro = root / case.repro
    record = find_record(results, cell, combo)
    return Export(cell, case, combo, expected_for(case, cell, pins), repro, record, upstream_for(repro, cell))
