"""The terminal table: cells grouped by case, one numbered column per combo, the combo key with counts, and the
entries that need attention.

Every string that comes from a record or from matrix.yaml (cell and case ids, titles, combo ids, versions, messages)
goes through ``shown``: a terminal escape in any of them is printed as ``\\x1b``, never obeyed.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from fsdp_matrix.clip import clip
from fsdp_matrix.report.grid import Grid
from fsdp_matrix.report.style import CODES, STYLES, legend, symbol

# C0 and C1 controls: ESC starts a terminal sequence, and 0x9b (CSI) does on terminals that read 8-bit controls
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_CONTROL_KEEP_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _hex(match: re.Match) -> str:
    return f"\\x{ord(match.group()):02x}"


def shown(text: Any) -> str:
    """``text`` with every control character (newlines included) written as ``\\xNN``."""
    return _CONTROL.sub(_hex, "" if text is None else str(text))


def shown_lines(text: Any) -> str:
    """Like ``shown``, but newlines and tabs stay: for tracebacks and stack dumps."""
    return _CONTROL_KEEP_LINES.sub(_hex, "" if text is None else str(text))


def one_line(text: Optional[str], limit: int = 400) -> str:
    """``text`` on one line, control characters shown as ``\\xNN``, clipped to ``limit``."""
    return clip(shown(clip(text, flat=True)), limit)


def summary_line(grid: Grid) -> str:
    return (
        f"fsdp-matrix report: {len(grid.rows)} cells x {len(grid.columns)} combos, "
        f"{len(grid.attention()) + len(grid.skipped)} need attention"
        + (f", {grid.skipped_text()}" if grid.skipped else "")
        + (f" ({shown(grid.source)})" if grid.source else "")
    )


def render_text(grid: Grid, width: int = 3) -> str:
    """The terminal table: cells grouped by case, one numbered column per combo, then the combo key with counts."""
    width = max(width, len(str(len(grid.columns))) + 1)
    name_w = max([len(shown(r.cell)) + 2 for r in grid.rows] + [len(shown(r.case)) for r in grid.rows] + [10])
    out = [summary_line(grid), legend(), ""]
    header = " " * name_w + "".join(f"{c.number:>{width}}" for c in grid.columns)
    out.append(header)
    case = None
    for row in grid.rows:
        if row.case != case:
            case = row.case
            title = grid.case_titles.get(case)
            out.append(shown(case) + (f"  ({one_line(title)})" if title else ""))
        out.append(
            f"  {shown(row.cell):<{name_w - 2}}"
            + "".join(f"{symbol(grid.code(c, row)):>{width}}" for c in grid.columns)
        )
    out += ["", _counts_text(grid)]
    if grid.unrun:
        out.append(f"Combos in matrix.yaml with no record: {shown(', '.join(grid.unrun))}")
    if grid.skipped:
        out.append(f"Not read: {grid.skipped_text()} (each is named on stderr by `python -m fsdp_matrix report`)")
    items = len(grid.attention()) + len(grid.skipped)
    out += ["", f"Needs attention ({items}):" if items else "Needs attention: nothing."]
    # a line no reader can parse may hold any verdict, a REGRESSION included: it is an alert, not a footnote
    out += [
        f"  ?? {one_line(f'{skip.file}:{skip.line}')}: quarantined, not a record: {one_line(skip.reason, 200)}"
        for skip in grid.skipped
    ]
    for failure in grid.env_failures():
        col = failure.column
        out.append(
            f"  {symbol('env-error'):<3}[{col.number} {shown(col.id)}] {cells_text(len(failure.rows))} could not run: "
            f"{one_line(failure.reason)}"
        )
        out.append(f"       fix that, then: {shown(failure.rerun)}")
    out += [
        f"  {symbol(rec.verdict):<3}[{col.number} {shown(col.id)}] {shown(row.key)}: {one_line(rec.line)}"
        for row, col, rec in grid.attention_cells()
    ]
    if grid.gone:
        out += ["", f"Not in matrix.yaml ({len(grid.gone)}): {gone_text(grid)}"]
        out += [f"  {shown(key)}" for key in grid.gone[:GONE_SHOWN]]
        out += [f"  ... and {len(grid.gone) - GONE_SHOWN} more"] if len(grid.gone) > GONE_SHOWN else []
    return "\n".join(out) + "\n"


GONE_SHOWN = 20
"""Stale cells named one per line; the rest are counted (the JSON report lists them all)."""


def gone_text(grid: Grid) -> str:
    return (
        "records of cells matrix.yaml no longer has (a case or grid removed or renamed); "
        f"`python -m fsdp_matrix report {grid.source or 'RESULTS'} --prune` moves them to cells.pruned.jsonl"
    )


def cells_text(n: int) -> str:
    return f"{n} cell{'s' if n != 1 else ''}"


def _counts_text(grid: Grid) -> str:
    id_w = max([len(shown(c.id)) for c in grid.columns] + [5])
    head = f"{'#':>3}  {'combo':<{id_w}}" + "".join(f"{symbol(c):>4}" for c in CODES) + "  versions"
    lines = [head]
    for col in grid.columns:
        counts = grid.counts(col)
        extra = "".join(f" {shown(code)}:{n}" for code, n in counts.items() if code not in STYLES)
        lines.append(
            f"{col.number:>3}  {shown(col.id):<{id_w}}"
            + "".join(f"{counts[c]:>4}" for c in CODES)
            + f"  {shown(col.versions_text())}{extra}"
        )
    return "\n".join(lines)
