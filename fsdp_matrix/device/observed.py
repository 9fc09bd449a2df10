"""The GPU records kept in docs/pages/observed/gpu/, judged again under today's matrix.yaml.

A record keeps the verdict of the rules it ran under. The rules written from a device run must keep agreeing with it
when they change later: ``rejudge`` replays each kept record's observation against the rule that decides its cell
now (tests/device/test_observed.py runs it over every kept record).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List

from fsdp_matrix.cells import find_cell
from fsdp_matrix.expectations import expected_for
from fsdp_matrix.matrix import Matrix
from fsdp_matrix.verdicts import judge

OBSERVED = Path(__file__).resolve().parents[2] / "docs" / "pages" / "observed" / "gpu"
"""Where the device runs' records are kept, one folder per day, one per call under it."""


@dataclass(frozen=True)
class Rejudged:
    """One kept record under today's rules."""

    key: str
    """CASE/CELL."""
    verdict: str
    """The verdict today's rules give the recorded observation."""
    line: str
    """Expected against observed, in one line."""
    path: str
    """The records file it came from."""


def rejudge(paths: Iterable[Path], matrix: Matrix) -> List[Rejudged]:
    """Every record of ``paths`` (cells*.jsonl) judged again under ``matrix`` with the versions it recorded."""
    cases = {c.id: c for c in matrix.cases}
    out = []
    for path in paths:
        for text in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(text)
            key = f"{record['case']}/{record['cell']}"
            cell = find_cell(matrix, key, record["device"])
            expected = expected_for(cases[record["case"]], cell, record["versions"])
            seen = record["observed"]
            ranks = seen.get("ranks") or []
            judgement = judge(
                expected,
                seen["status"],
                seen.get("error_type"),
                seen.get("error_message"),
                seen.get("location"),
                stacks=[r.get("stack") for r in ranks],
                warnings=[w for r in ranks for w in (r.get("warnings") or [])],
            )
            out.append(Rejudged(key, judgement.verdict.value, judgement.line, str(path)))
    return out
