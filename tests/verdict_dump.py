"""Same-verdict check for a change to the rules or to matching: every (combo, device, run layout, cell) and what the
harness expects of it, one line each: Expected.to_json() (source included), the unmet requirement, and every trial
of expectations.trace (stage, name, matched, why, outcome, decides).

Run it before and after the change and compare: ``python -m tests.verdict_dump > before.tsv``, change,
``python -m tests.verdict_dump > after.tsv``, ``cmp before.tsv after.tsv``. Issue 38's one rule grammar was checked
so: 96,200 pairs, byte-identical."""

from __future__ import annotations

import json
import sys

from fsdp_matrix.cells import expand, unmet_requirement
from fsdp_matrix.expectations import expected_for, trace
from fsdp_matrix.matrix import load_matrix


def rows(matrix):
    """(key, JSON text) of every (combo, device, run layout, cell)."""
    for combo in matrix.combos:
        versions = combo.pins.model_dump()
        for device in ("cpu", "cuda"):
            for ws, nodes in ((1, 1), (2, 1), (4, 1), (4, 2)):
                for cell in expand(matrix, device, ws, nodes=nodes):
                    yield (
                        f"{combo.id}|{device}|ws{ws}n{nodes}|{cell.key}",
                        json.dumps(_row(matrix, cell, versions), sort_keys=True),
                    )


def _row(matrix, cell, versions):
    case = matrix.case(cell.case)
    tr = trace(case, cell, versions)
    return {
        "expected": expected_for(case, cell, versions).to_json(),
        "trace_expected": tr.expected.to_json(),
        "requires": unmet_requirement(case.requires, cell),
        "trace_requirement": tr.requirement,
        "trials": [[t.stage, t.name, t.matched, t.why, t.outcome, t.decides] for t in tr.trials],
    }


def main() -> None:
    matrix = load_matrix(sys.argv[1] if len(sys.argv) > 1 else None)
    pairs = 0
    for key, text in rows(matrix):
        sys.stdout.write(f"{key}\t{text}\n")
        pairs += 1
    print(f"pairs {pairs}", file=sys.stderr)


if __name__ == "__main__":
    main()
