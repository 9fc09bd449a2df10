"""What a combo whose env cannot be built records: one env-error record for each cell the run asked for.

The cells are those the pytest run would have run. ``--cases`` is read as the plugin reads it. ``-k`` cannot be
handed to pytest's collection, which needs the env that just failed, so it is evaluated with pytest's own
keyword-expression engine (the one ``pytest -k`` compiles) against the names pytest matches for a cell's test: the
``tests`` folder, ``test_repros.py``, ``test_cell[<case>/<cell>]`` and the ``cell`` marker. Where pytest cannot be
imported, ``-k`` is not applied and the note says so. ``tests/envs/test_failed.py`` holds this to pytest's own
``--collect-only`` selection.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from fsdp_matrix.cells import Cell, expand
from fsdp_matrix.envs.sources import env_sources
from fsdp_matrix.expectations import expected_for
from fsdp_matrix.matrix import Matrix
from fsdp_matrix.records import RECORDS_FILE, append, env_error, iter_records
from fsdp_matrix.verdicts import make_record


def selection(pytest_args: Sequence[str]) -> Tuple[Optional[List[str]], Optional[str]]:
    """(``--cases`` ids or None, the ``-k`` expression or None) among the arguments handed to pytest."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--cases")
    parser.add_argument("-k", dest="keyword")
    opts, _ = parser.parse_known_args(list(pytest_args))
    cases = [c.strip() for c in opts.cases.split(",") if c.strip()] if opts.cases else None
    return cases or None, opts.keyword or None


def selected_cells(matrix: Matrix, device: str, world_size: int, pytest_args: Sequence[str]) -> Tuple[List[Cell], str]:
    """The cells a pytest run with ``pytest_args`` selects, and a note when ``-k`` could not be applied."""
    cases, keyword = selection(pytest_args)
    cells = expand(matrix, device, world_size, cases)
    if not keyword:
        return cells, ""
    try:
        from _pytest.mark.expression import Expression
    except ImportError:
        return cells, f"-k {keyword!r} is not applied to these records: pytest cannot be imported here"
    try:
        expression = Expression.compile(keyword)
    except Exception as exc:  # pytest's ParseError; pytest itself would refuse the run
        return cells, f"-k {keyword!r} is not applied to these records: {exc}"

    def matches(cell: Cell) -> bool:
        names = ("tests", "test_repros.py", f"test_cell[{cell.key}]", "cell")
        return expression.evaluate(lambda sub, **_: any(sub.lower() in n.lower() for n in names))

    return [c for c in cells if matches(c)], ""


def last_known_pins(results: Path, pins: Mapping[str, str]) -> Dict[str, str]:
    """The versions of the newest record in ``results`` (a combo's folder) for the pinned packages, else ``pins``.

    A floating combo whose resolution failed is recorded with what it last ran, so tonight's column is comparable."""
    records = list(iter_records(results / RECORDS_FILE, skipped=[])) if (results / RECORDS_FILE).is_file() else []
    # what it last ran, else what it last tried
    ran = [r for r in records if r.verdict != "env-error"] or records
    newest = max(ran, key=lambda r: r.finished_at, default=None)
    if newest is None:
        return dict(pins)
    return {name: newest.versions.get(name) or version for name, version in pins.items()}


def write_env_errors(
    matrix: Matrix,
    combo: str,
    results: Path,
    cells: Sequence[Cell],
    message: str,
    versions: Mapping[str, Optional[str]],
    sources: Optional[Mapping[str, Mapping]] = None,
) -> int:
    """One env-error record per cell, judged against the rule for ``versions``; returns how many were written.
    ``sources``: the packages the env was to build from source (default: what this interpreter's env says)."""
    observed = env_error(message)
    sources = dict(sources) if sources is not None else env_sources(versions=versions)
    for cell in cells:
        expected = expected_for(matrix.case(cell.case), cell, dict(versions))
        append(results, make_record(cell, expected, observed, versions, 0.0, combo, "env-error", sources))
    return len(cells)
