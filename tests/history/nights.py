"""Three fake nights of two combos, written as results dirs the way the nightly leaves them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Dict, List, Optional

from fsdp_matrix.records import Confirmation, append
from tests.report.samples import VERSIONS, make_record

NIGHTS = ("2026-11-24", "2026-11-25", "2026-11-26")
LATER = "2026-11-27"
"""A fourth night, written with ``write_night(root, 3, ...)``: each cell keeps its third night's verdict."""
DAY = 86_400.0
START = 1_795_500_000.0  # 2026-11-24 UTC
# (combo, case, cell) -> verdict per night ("~" prefix: tonight's flip the reruns called flaky)
PLAN: Dict[tuple, List[str]] = {
    ("newest", "dora", "broken-ws2"): ["fix-holds", "REGRESSION", "REGRESSION"],
    ("newest", "dora", "flaky-ws2"): ["fix-holds", "~crash", "fix-holds"],
    ("newest", "lora", "steady-ws2"): ["reproduced", "reproduced", "reproduced"],
    ("main", "lora", "late-ws2"): ["fix-holds", "fix-holds", "DIFFERENT-ERROR"],
}
BUMP = "peft 0.22.1"


def nightly_json(path: Path) -> Path:
    """What ``nightly --json`` wrote on the second night: the upgrade check named peft 0.22.1 for the broken cell."""
    changed = {"cell": "dora/broken-ws2", "base_verdict": "fix-holds", "target_verdict": "REGRESSION"}
    changed |= {"first_changed": {"peft": "0.22.1"}, "last_unchanged": {"peft": "0.22.0"}}
    bisect = {"cells": {"lora/late-ws2": {"commit": {"sha": "c" * 40, "subject": "Refactor wrap (#3001)", "pr": 3001}}}}
    data = {
        "diff": "",
        "upgrades": [
            {"column": "newest", "bumps": {"peft": "0.22.1"}, "cases": ["dora"], "result": {"changed": [changed]}},
            {"column": "main", "package": "peft", "commit_bisect": bisect},
        ],
    }
    path.write_text(json.dumps(data))
    return path


def write_night(
    root: Path,
    n: int,
    confirm: Optional[Dict[str, Confirmation]] = None,
    only: Optional[set] = None,
    plan=None,
    run: Optional[str] = None,
) -> Path:
    """Night ``n`` (0-based) as a results dir: one subdir per combo, each with its cells.jsonl; ``only`` the combos
    named (a combo whose job died writes nothing); ``plan`` instead of ``PLAN``. Past the plan's last night each cell
    keeps its last verdict; a verdict ``-`` writes no record of that cell that night. Its records' run id is ``run``
    (default ``run-N``), and they go under ``night{n}-{run}`` when ``run`` is given."""
    out = root / (f"night{n}-{run}" if run else f"night{n}")
    versions = {**VERSIONS, "peft": "0.22.1" if n else "0.22.0"}
    for (combo, case, cell), verdicts in (plan or PLAN).items():
        if only is not None and combo not in only:
            continue
        verdicts = verdicts + [verdicts[-1].lstrip("~")] * (n + 1 - len(verdicts))
        verdict = verdicts[n].lstrip("~")
        if verdict == "-":  # no record of this cell tonight
            continue
        rec = make_record(cell, verdict, combo, case, finished_at=START + n * DAY, versions=versions)
        rec = dataclasses.replace(rec, run_id=run or f"run-{n}")
        if verdicts[n].startswith("~"):
            rec.confirmation = Confirmation(status="flaky", previous=verdicts[n - 1], reruns=["fix-holds"] * 2)
        elif n and verdict != verdicts[n - 1]:
            rec.confirmation = Confirmation(status="confirmed", previous=verdicts[n - 1], reruns=[verdict] * 2)
        append(out / combo, rec)
    return out
