"""Runs a sequence of hostile cells (hostile_cells.py) and probes in one Session: what the isolation tests share."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Sequence

from fsdp_matrix.cells import Cell
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.records import Record, iter_records
from fsdp_matrix.runner.launcher import Launcher
from fsdp_matrix.runner.session import Session

HERE = Path(__file__).resolve().parent
CELL_TIMEOUT_S = 60.0
"""Generous: the cells are tiny; a hang here would be a harness bug, not a slow machine."""


def cell(i: int, fault: str) -> Cell:
    return Cell("hostile", (("fault", fault), ("n", i)))


def run_sequence(tmp: Path, faults: Sequence[str]) -> List[Record]:
    """Every fault in order on one Session; returns the records as written to cells.jsonl (read back)."""
    launcher = Launcher(run_root=tmp / "launches", cell_timeout=CELL_TIMEOUT_S, python=sys.executable)
    session = Session(load_matrix(HERE / "hostile_matrix.yaml"), launcher, tmp, {"torch": "2.13.0"}, repo_root=HERE)
    cells = [cell(i, f) for i, f in enumerate(faults)]
    try:
        session.prefetch(cells)
        for c in cells:
            session.run(c)
    finally:
        session.close()
    written = {r.cell: r for r in iter_records(tmp / "cells.jsonl")}
    return [written.get(c.id) for c in cells]
