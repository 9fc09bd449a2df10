"""Expected outcome of every cell on every combo's pins: what tests/test_platform.py compares before/after a move of
rules. Uses only the API main had at a9cf680, so the same function made tests/fixtures/expectations_main.json from
main's code (``PYTHONPATH=<main checkout> python -m tests.outcomes > tests/fixtures/expectations_main.json``)."""

from __future__ import annotations

import json
import sys
from typing import Any, Dict


def device_of(combo: Any) -> str:
    return "cuda" if "gpu" in combo.tags else "cpu"


def outcomes(matrix: Any) -> Dict[str, Dict[str, Any]]:
    """``{combo id: {cell key: {requires, kind, error_type, match, module, reason}}}`` on each combo's pins."""
    from fsdp_matrix.cells import expand, unmet_requirement
    from fsdp_matrix.expectations import expected_for

    out: Dict[str, Dict[str, Any]] = {}
    for combo in matrix.combos:
        versions = combo.pins.model_dump()
        cells: Dict[str, Any] = {}
        for ws in (1, 2):
            for cell in expand(matrix, device_of(combo), ws):
                case = matrix.case(cell.case)
                exp = expected_for(case, cell, versions)
                cells[cell.key] = {
                    "requires": unmet_requirement(case.requires, cell),
                    "kind": exp.kind,
                    "error_type": exp.error_type,
                    "match": exp.match,
                    "module": exp.module,
                    "reason": exp.reason,
                }
        out[combo.id] = cells
    return out


FIELDS = ("requires", "kind", "error_type", "match", "module", "reason")


def encode(data: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Tables instead of 14,000 repeated dicts: cell keys and distinct outcomes once, each combo a list of indexes."""
    keys = sorted({k for cells in data.values() for k in cells})
    rows: list = []
    index: Dict[tuple, int] = {}
    combos = {}
    for combo, cells in data.items():
        col = []
        for key in keys:
            row = tuple(cells[key][f] for f in FIELDS) if key in cells else None
            col.append(-1 if row is None else index.setdefault(row, len(index)))
        combos[combo] = col
    rows = [list(r) for r, _ in sorted(index.items(), key=lambda kv: kv[1])]
    return {"fields": list(FIELDS), "keys": keys, "rows": rows, "combos": combos}


def decode(blob: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    rows = [dict(zip(blob["fields"], r)) for r in blob["rows"]]
    return {combo: {k: rows[i] for k, i in zip(blob["keys"], col) if i >= 0} for combo, col in blob["combos"].items()}


if __name__ == "__main__":
    from fsdp_matrix.matrix import load_matrix

    json.dump(encode(outcomes(load_matrix(sys.argv[1] if len(sys.argv) > 1 else None))), sys.stdout, indent=0)
    sys.stdout.write("\n")
