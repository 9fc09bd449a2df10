"""The terminal table: cells grouped by case, one numbered column per combo, the combo key with counts, and the
entries that need attention."""

from __future__ import annotations

import re
from typing import Optional

from fsdp_matrix.clip import clip
from fsdp_matrix.report.grid import Grid
from fsdp_matrix.report.style import CODES, STYLES, legend, symbol

# a message may carry terminal escapes (colored logs); shown literally they cannot restyle the reader's terminal
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def one_line(text: Optional[str], limit: int = 400) -> str:
    """``text`` on one line, control characters shown as ``\\xNN``, clipped to ``limit``."""
    return clip(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", clip(text, flat=True)), limit)


def summary_line(grid: Grid) -> str:
    return (
        f"fsdp-matrix report: {len(grid.rows)} cells x {len(grid.columns)} combos, "
        f"{len(grid.attention())} need attention" + (f" ({grid.source})" if grid.source else "")
    )


def render_text(grid: Grid, width: int = 3) -> str:
    """The terminal table: cells grouped by case, one numbered column per combo, then the combo key with counts."""
    width = max(width, len(str(len(grid.columns))) + 1)
    name_w = max([len(r.cell) + 2 for r in grid.rows] + [len(r.case) for r in grid.rows] + [10])
    out = [summary_line(grid), legend(), ""]
    header = " " * name_w + "".join(f"{c.number:>{width}}" for c in grid.columns)
    out.append(header)
    case = None
    for row in grid.rows:
        if row.case != case:
            case = row.case
            title = grid.case_titles.get(case)
            out.append(f"{case}" + (f"  ({title})" if title else ""))
        out.append(
            f"  {row.cell:<{name_w - 2}}" + "".join(f"{symbol(grid.code(c, row)):>{width}}" for c in grid.columns)
        )
    out += ["", _counts_text(grid)]
    if grid.unrun:
        out.append(f"Combos in matrix.yaml with no record: {', '.join(grid.unrun)}")
    items = grid.attention()
    out += ["", f"Needs attention ({len(items)}):" if items else "Needs attention: nothing."]
    out += [
        f"  {symbol(rec.verdict):<3}[{col.number} {col.id}] {row.key}: {one_line(rec.line)}" for row, col, rec in items
    ]
    return "\n".join(out) + "\n"


def _counts_text(grid: Grid) -> str:
    id_w = max([len(c.id) for c in grid.columns] + [5])
    head = f"{'#':>3}  {'combo':<{id_w}}" + "".join(f"{symbol(c):>4}" for c in CODES) + "  versions"
    lines = [head]
    for col in grid.columns:
        counts = grid.counts(col)
        extra = "".join(f" {code}:{n}" for code, n in counts.items() if code not in STYLES)
        lines.append(
            f"{col.number:>3}  {col.id:<{id_w}}"
            + "".join(f"{counts[c]:>4}" for c in CODES)
            + f"  {col.versions_text()}{extra}"
        )
    return "\n".join(lines)
