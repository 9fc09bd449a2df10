"""Expected outcome of every cell on every combo's pins: what tests/test_platform.py compares before/after a move of
rules. Uses only the API main had at a9cf680, so the same function made tests/fixtures/expectations_main.json from
main's code (``PYTHONPATH=<main checkout> python -m tests.outcomes > tests/fixtures/expectations_main.json``).

``--full``: every field of every cell on both devices (``full_outcomes``), what tests/test_expectations.py compares
with tests/fixtures/expectations_full.json, made with commit 534148c's code and matrix.yaml (before the rules'
evidence moved out of matrix.yaml; ``full_outcomes`` uses only what that commit has). Regenerate it, when matrix.yaml
changes an expectation on purpose, with ``python -m tests.outcomes --full > tests/fixtures/expectations_full.json``."""

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


def full_outcomes(matrix: Any) -> Dict[str, Dict[str, str]]:
    """``{"combo|device": {cell key: JSON}}``: everything ``expected_for`` answers (``Expected.to_json``: kind, error
    signature, skip reason, deciding rule or platform skip, hang timeout, warnings, the platform signatures that
    apply) and the unmet requirement, on each combo's pins, on both devices, world sizes 1 and 2 (and the layouts
    grids pin). Rule citations (``source``) are left out: they are text that may move to the evidence files."""
    from fsdp_matrix.cells import expand, unmet_requirement
    from fsdp_matrix.expectations import expected_for

    out: Dict[str, Dict[str, str]] = {}
    for combo in matrix.combos:
        versions = combo.pins.model_dump()
        for device in ("cpu", "cuda"):
            cells: Dict[str, str] = {}
            for ws in (1, 2):
                for cell in expand(matrix, device, ws):
                    case = matrix.case(cell.case)
                    exp = expected_for(case, cell, versions).to_json()
                    exp.pop("source", None)
                    for sig in exp.get("signatures", ()):
                        sig.pop("source", None)
                    exp["requires"] = unmet_requirement(case.requires, cell)
                    cells[cell.key] = json.dumps(exp, sort_keys=True)
            out[f"{combo.id}|{device}"] = cells
    return out


def encode_full(data: Dict[str, Dict[str, str]]) -> Dict[str, Any]:
    """As ``encode``: cell keys and distinct outcomes (JSON text) once, each combo and device a list of indexes."""
    keys = sorted({k for cells in data.values() for k in cells})
    index: Dict[str, int] = {}
    columns = {
        col: [index.setdefault(cells[k], len(index)) if k in cells else -1 for k in keys] for col, cells in data.items()
    }
    return {"keys": keys, "rows": list(index), "columns": columns}


def dump_full(blob: Dict[str, Any]) -> str:
    """``encode_full``'s blob as JSON text: one key or row a line, one combo and device a line."""
    head = [f'"keys": {json.dumps(blob["keys"], indent=0)},', f'"rows": {json.dumps(blob["rows"], indent=0)},']
    cols = [f"{json.dumps(c)}: {json.dumps(v, separators=(',', ':'))}" for c, v in blob["columns"].items()]
    return "{\n" + "\n".join(head) + '\n"columns": {\n' + ",\n".join(cols) + "\n}\n}\n"


def decode_full(blob: Dict[str, Any]) -> Dict[str, Dict[str, str]]:
    rows = blob["rows"]
    return {col: {k: rows[i] for k, i in zip(blob["keys"], idx) if i >= 0} for col, idx in blob["columns"].items()}


if __name__ == "__main__":
    from fsdp_matrix.matrix import load_matrix

    args = [a for a in sys.argv[1:] if a != "--full"]
    matrix = load_matrix(args[0] if args else None)
    if "--full" in sys.argv:
        sys.stdout.write(dump_full(encode_full(full_outcomes(matrix))))
    else:
        json.dump(encode(outcomes(matrix)), sys.stdout, indent=0)
        sys.stdout.write("\n")
