"""The report as GitHub markdown (report.md and the job's step summary)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, Optional

from fsdp_matrix.report.grid import Grid
from fsdp_matrix.report.style import CODES, legend, needs_attention, symbol
from fsdp_matrix.report.text import cells_text, gone_text, one_line, summary_line

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+!|~&])")


def md_escape(text: Optional[str], limit: int = 400) -> str:
    """One line of literal text for GitHub markdown: its HTML and table pipes are escaped, never interpreted."""
    return _MD_SPECIAL.sub(r"\\\1", one_line(text, limit))


def render_markdown(grid: Grid) -> str:
    out = ["## fsdp-matrix report", "", md_escape(summary_line(grid)), "", md_escape(legend()), ""]
    out.append("| cell | " + " | ".join(str(c.number) for c in grid.columns) + " |")
    out.append("|---|" + "---|" * len(grid.columns))
    for row in grid.rows:
        marks = []
        for col in grid.columns:
            code = grid.code(col, row)
            marks.append(f"**{md_escape(symbol(code))}**" if needs_attention(code) else md_escape(symbol(code)))
        out.append(f"| {md_escape(row.key)} | " + " | ".join(marks) + " |")
    out += [
        "",
        "| # | combo | " + " | ".join(md_escape(symbol(c)) for c in CODES) + " | versions |",
        "|---|---|" + "---|" * len(CODES) + "---|",
    ]
    for col in grid.columns:
        counts = grid.counts(col)
        out.append(
            f"| {col.number} | {md_escape(col.label)} | "
            + " | ".join(str(counts[c]) for c in CODES)
            + f" | {md_escape(col.versions_text())} |"
        )
    if grid.unrun:
        out += ["", "Combos in matrix.yaml with no record: " + md_escape(", ".join(grid.unrun))]
    items = grid.attention()
    out += ["", f"### Needs attention ({len(items)})" if items else "### Needs attention: nothing", ""]
    for failure in grid.env_failures():
        col = failure.column
        out.append(
            f"- **{md_escape(symbol('env-error'))}** env-error in {col.number} \\({md_escape(col.id)}\\): "
            f"{cells_text(len(failure.rows))} could not run: {md_escape(failure.reason)}. "
            f"Fix that, then: {md_escape(failure.rerun)}"
        )
    out += [
        f"- **{md_escape(symbol(rec.verdict))}** {md_escape(rec.verdict)} in {col.number} "
        f"\\({md_escape(col.id)}\\) {md_escape(row.key)}: {md_escape(rec.line)}"
        for row, col, rec in grid.attention_cells()
    ]
    if grid.gone:
        out += ["", f"### Not in matrix.yaml ({len(grid.gone)})", "", md_escape(gone_text(grid)), ""]
        out += [f"- {md_escape(key)}" for key in grid.gone]
    return "\n".join(out) + "\n"


STEP_SUMMARY_LIMIT = 1024 * 1024 - 4096
"""GitHub rejects a step summary over 1 MiB; keep some room for whatever else the job wrote."""


def append_step_summary(markdown: str, env: Optional[Dict[str, str]] = None) -> Optional[Path]:
    """Append to $GITHUB_STEP_SUMMARY when it is set; returns the file written, or None."""
    target = (os.environ if env is None else env).get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    data = markdown.encode("utf-8")
    if len(data) > STEP_SUMMARY_LIMIT:
        note = b"\n\n*(truncated: the whole report is in report.md)*\n"
        data = data[: STEP_SUMMARY_LIMIT - len(note)].decode("utf-8", "ignore").encode() + note
    with open(target, "ab") as fh:
        fh.write(data)
    return Path(target)
