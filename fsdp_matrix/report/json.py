"""The report as JSON. ``diff`` compares two of these between nightlies, so its shape is a contract: ordered
``columns`` and ``rows``, ``entries[column id][case/cell]`` (one summary per record) and ``counts``."""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Any, Dict

from fsdp_matrix.clip import clip
from fsdp_matrix.records import Record
from fsdp_matrix.report.grid import Grid

REPORT_SCHEMA = 1


def record_summary(rec: Record) -> Dict[str, Any]:
    obs = rec.observed
    return {
        "verdict": rec.verdict,
        "line": rec.line,
        "status": obs.status,
        "error_type": obs.error_type,
        "error_message": clip(obs.error_message, 2000) or None,
        "location": obs.location,
        "expected": rec.expected,
        "versions": rec.versions,
        **({"sources": rec.sources} if rec.sources else {}),
        **({"confirmation": asdict(rec.confirmation)} if rec.confirmation else {}),
        "device": rec.device,
        "world_size": rec.world_size,
        "nodes": rec.nodes,
        "duration_s": rec.duration_s,
        "run_id": rec.run_id,
        "host": rec.host,
        # NaN or infinity would make report.json invalid JSON for strict readers
        "finished_at": rec.finished_at if math.isfinite(rec.finished_at) else None,
    }


def to_json(grid: Grid) -> Dict[str, Any]:
    return {
        "schema": REPORT_SCHEMA,
        "generated_at": time.time(),
        "source": grid.source,
        "columns": [
            {"id": c.id, "number": c.number, "label": c.label, "versions": c.versions, "mixed": c.mixed}
            | ({"sources": c.sources} if c.sources else {})
            for c in grid.columns
        ],
        "rows": [{"case": r.case, "cell": r.cell} for r in grid.rows],
        "entries": {
            c.id: {r.key: record_summary(rec) for r in grid.rows if (rec := grid.entry(c, r))} for c in grid.columns
        },
        "counts": {c.id: grid.counts(c) for c in grid.columns},
        "attention": [{"column": c.id, "cell": r.key, "verdict": rec.verdict} for r, c, rec in grid.attention()],
        "unrun_combos": grid.unrun,
        "not_in_matrix": grid.gone,
        "skipped_lines": [{"file": str(s.file), "line": s.line, "reason": s.reason} for s in grid.skipped],
    }
