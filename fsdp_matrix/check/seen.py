"""What runs observed, for the evidence of an answer: the newest record per combo and cell of a results dir
(``--results``, read as triage reads it) or of a history DB (``--history``, the newest night per combo and cell).

The evidence of an expectation is, in order: observed on a combo with the user's versions; observed on the nearest
combo; else the rule's own bounds (matrix.yaml, no record read).
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from fsdp_matrix.errors import MatrixError
from fsdp_matrix.matrix import Combo
from fsdp_matrix.triage.cli import _observed_here, load_records

HERE = "here"
"""The combo of a record made without one (``check --run``, ``run`` in the installed env)."""
LEVELS = ("observed", "nearest-combo", "rules")
"""Evidence levels, strongest first."""


@dataclass(frozen=True)
class Seen:
    """One cell's newest outcome on one combo (the fields of a Record that the evidence reads)."""

    combo: str
    case: str
    cell: str
    verdict: str
    versions: Dict[str, Optional[str]] = field(default_factory=dict, hash=False, compare=False)


def from_results(path: Path) -> Tuple[List[Seen], str]:
    """The newest record per combo and cell under a results dir, and one line saying what was read."""
    records, skipped = load_records(path)
    lost = f", {len(skipped)} lines skipped (not records)" if skipped else ""
    seen = [Seen(r.combo or HERE, r.case, r.cell, r.verdict, dict(r.versions)) for r in records]
    return seen, f"records: {len(seen)} read from {path}{lost}"


_NEWEST = """
SELECT c.combo, c.case_id, c.cell, c.verdict, co.versions FROM cells c
JOIN nights n ON n.night = c.night LEFT JOIN combos co ON co.night = c.night AND co.combo = c.combo
ORDER BY n.ran_at
"""


def from_history(path: Path) -> Tuple[List[Seen], str]:
    """The newest night's outcome per combo and cell of a history DB (``python -m fsdp_matrix history add``)."""
    if not path.is_file():
        raise MatrixError(f"--history: {path}: no such file")
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            rows = db.execute(_NEWEST).fetchall()
    except sqlite3.Error as exc:
        raise MatrixError(f"--history: {path}: not a history DB: {exc}") from None
    newest: Dict[Tuple[str, str, str], Seen] = {}
    for combo, case, cell, verdict, versions in rows:
        newest[(combo, case, cell)] = Seen(combo, case, cell, verdict, json.loads(versions or "{}"))
    return list(newest.values()), f"history: {len(newest)} cells read from {path}"


def _counts(seen: Iterable[Seen]) -> str:
    counts = Counter(s.verdict for s in seen)
    return ", ".join(f"{v} {n}" for v, n in counts.most_common())


def evidence(
    seen: List[Seen], case_id: str, cells: List[str], versions: Mapping[str, Optional[str]], near: Optional[Combo]
) -> Tuple[str, str]:
    """(level, line) for these cells of a case: their records on the user's versions, else on the nearest combo,
    else none (the rule's own bounds)."""
    if not seen:
        return "rules", "the rule's own bounds (matrix.yaml; no records given: --results DIR or --history DB)"
    where, by_cell = _observed_here(case_id, versions, near, seen)
    mine = [by_cell[c] for c in cells if c in by_cell]
    if not mine:
        return "rules", "the rule's own bounds (no record of these cells on your versions or the nearest combo)"
    level = "observed" if where == "on your versions" else "nearest-combo"
    combos = ", ".join(sorted({s.combo for s in mine}))
    ran = "run here" if combos == HERE else f"combo {combos}"
    where += f" ({ran})" if level == "observed" else ""  # the nearest combo's line already names it
    return level, f"observed {where}: {_counts(mine)} of {len(cells)} cell(s)"
