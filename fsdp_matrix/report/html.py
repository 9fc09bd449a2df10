"""The report as one self-contained HTML page: a colored grid of cells x combos and a details pane per entry.

No external asset, no server: the page works from a CI artifact or a mail attachment. The grid, the combo counts and
the needs-attention list are plain HTML; a grid entry links to ``#e-N``, and a small inline script draws that
entry's pane from one JSON blob in which each distinct traceback is stored once (report/panes.py), which keeps the
page of a full matrix small. Every string from a record in the HTML goes through ``esc`` (html.escape with quotes):
error messages carry ``<``, ``>``, ``&``, quotes and backticks.
"""

from __future__ import annotations

import html
import re
import time
from typing import Any, Dict, Tuple

from fsdp_matrix.report.grid import Grid
from fsdp_matrix.report.panes import pane_data, script_elements
from fsdp_matrix.report.style import CODES, MISSING, STYLES, legend, style, symbol

CSS = """
body { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px 20px 45vh; color: #212121; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 22px 0 6px; }
.sub { color: #616161; margin-bottom: 10px; }
table { border-collapse: collapse; }
.legend span.sw, .grid td.v { font: 600 12px ui-monospace, Menlo, Consolas, monospace; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 14px; margin: 8px 0 12px; align-items: center; }
.legend span.sw { display: inline-block; min-width: 22px; text-align: center; padding: 1px 3px; border-radius: 3px;
  border: 1px solid #ccc; margin-right: 4px; }
.grid th, .grid td { border: 1px solid #e0e0e0; }
.grid thead th { position: sticky; top: 0; background: #fafafa; z-index: 2; padding: 3px 2px; min-width: 30px; }
.grid th.combo { vertical-align: bottom; font-size: 12px; }
.grid th.combo .cid { display: block; writing-mode: vertical-rl; transform: rotate(180deg); margin: 0 auto 4px;
  font: 11px ui-monospace, Menlo, Consolas, monospace; color: #424242; max-height: 190px; overflow: hidden;
  text-overflow: ellipsis; white-space: nowrap; }
.grid th.cell { text-align: left; font: 12px ui-monospace, Menlo, Consolas, monospace; padding: 1px 8px 1px 14px;
  white-space: nowrap; background: #fff; position: sticky; left: 0; z-index: 1; font-weight: normal; }
.grid tr.case th { text-align: left; background: #f5f5f5; padding: 5px 8px 3px; font-size: 13px; position: sticky;
  left: 0; }
.grid tr.case th span { font-weight: normal; color: #616161; }
.grid tbody tr:hover th.cell { background: #fff8c4; }
.grid td.v { text-align: center; padding: 0; }
.grid td.v a { display: block; padding: 2px 4px; color: inherit; text-decoration: none; }
.grid td.v a:hover { outline: 2px solid #212121; }
.counts td, .counts th { border: 1px solid #e0e0e0; padding: 2px 6px; }
.counts td.n { text-align: right; } .counts td.n.zero { color: #ccc; }
.counts td.ver { font: 12px ui-monospace, Menlo, Consolas, monospace; color: #424242; }
.att li { margin: 3px 0; } .att a { text-decoration: none; }
.att .sw, .pane .sw { font: 600 12px ui-monospace, monospace; padding: 0 4px; border-radius: 3px; }
.att code, .pane code { font: 12px ui-monospace, Menlo, Consolas, monospace; }
.pane { position: fixed; left: 0; right: 0; bottom: 0; max-height: 42vh; overflow: auto;
  background: #fff; border-top: 3px solid #424242; box-shadow: 0 -4px 14px rgba(0,0,0,.18); padding: 10px 20px;
  z-index: 5; }
.pane[hidden] { display: none; }
.pane h3 { margin: 0 0 6px; font-size: 15px; } .pane .close { float: right; font-size: 18px; text-decoration: none; }
.pane dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 6px 0; }
.pane dt { color: #616161; } .pane dd { margin: 0; word-break: break-word; }
.pane pre { background: #f7f7f7; border: 1px solid #e0e0e0; padding: 6px 8px; white-space: pre-wrap;
  font: 12px/1.35 ui-monospace, Menlo, Consolas, monospace; max-height: 30vh; overflow: auto; }
.muted { color: #9e9e9e; }
.v-unknown { background: #000; color: #ff0; }
"""


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _css_class(code: str) -> str:
    return "v-" + re.sub(r"[^a-z0-9]+", "-", code.lower())


def _palette() -> str:
    return "\n".join(
        f".{_css_class(code)} {{ background: {s.background}; color: {s.color}; }}" for code, s in STYLES.items()
    )


def _swatch(code: str) -> str:
    look = style(code)
    return f'<span class="sw" style="background:{look.background};color:{look.color}">{esc(symbol(code))}</span>'


def render_html(grid: Grid) -> str:
    anchors, data = pane_data(grid)
    items = grid.attention()
    generated = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    body = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>fsdp-matrix report: {len(items)} need attention</title>",
        f"<style>{CSS}\n{_palette()}</style></head><body>",
        "<h1>fsdp-matrix report</h1>",
        f'<div class="sub">{len(grid.rows)} cells &times; {len(grid.columns)} combos &middot; '
        f"<b>{len(items)}</b> need attention &middot; {esc(grid.source)} &middot; generated {esc(generated)}"
        + (f" &middot; <b>{esc(grid.skipped_text())}</b>" if grid.skipped else "")
        + "</div>",
        _legend(),
        _grid_table(grid, anchors),
        "<h2>Combos</h2>",
        _counts_table(grid),
    ]
    if grid.unrun:
        body.append(f"<p>Combos in matrix.yaml with no record: <code>{esc(', '.join(grid.unrun))}</code></p>")
    body.append(f"<h2>Needs attention ({len(items)})</h2>" if items else "<h2>Needs attention: nothing</h2>")
    if items:
        body.append(
            '<ul class="att">'
            + "".join(
                f'<li>{_swatch("env-error")} <a href="#{anchors[(f.column.id, f.rows[0].key)]}">'
                f"{len(f.rows)} cell{'s' if len(f.rows) != 1 else ''}</a> in <b>{f.column.number}</b> "
                f"{esc(f.column.label)} could not run: {esc(f.reason)}. "
                f"Fix that, then: <code>{esc(f.rerun)}</code></li>"
                for f in grid.env_failures()
            )
            + "".join(
                f'<li>{_swatch(rec.verdict)} <a href="#{anchors[(col.id, row.key)]}"><code>{esc(row.key)}</code></a> '
                f"in <b>{col.number}</b> {esc(col.label)}: {esc(rec.line)}</li>"
                for row, col, rec in grid.attention_cells()
            )
            + "</ul>"
        )
    body += ['<section class="pane" id="pane" hidden></section>', script_elements(data), "</body></html>"]
    return "\n".join(body) + "\n"


def _legend() -> str:
    parts = [f"<span>{_swatch(code)}{esc(STYLES[code].label or code)}</span>" for code in CODES]
    return f'<div class="legend" title="{esc(legend())}">{"".join(parts)}</div>'


def _grid_table(grid: Grid, anchors: Dict[Tuple[str, str], str]) -> str:
    head = "".join(
        f'<th class="combo" title="{esc(c.label)}&#10;{esc(c.versions_text())}"><span class="cid">'
        f"{esc(c.id)}</span>{c.number}</th>"
        for c in grid.columns
    )
    out = [
        '<table class="grid"><thead><tr><th class="cell" style="vertical-align: bottom">cell</th>'
        + head
        + "</tr></thead><tbody>"
    ]
    case = None
    for row in grid.rows:
        if row.case != case:
            case = row.case
            title = grid.case_titles.get(case)
            out.append(
                f'<tr class="case"><th colspan="{len(grid.columns) + 1}">{esc(case)}'
                + (f" <span>{esc(title)}</span>" if title else "")
                + "</th></tr>"
            )
        tds = []
        for col in grid.columns:
            rec = grid.entry(col, row)
            code = rec.verdict if rec else MISSING
            # no per-entry tooltip in the page: the script fills one from the pane data on first hover
            inner = f'<a href="#{anchors[(col.id, row.key)]}">{esc(symbol(code))}</a>' if rec else esc(symbol(code))
            tds.append(f'<td class="v {_css_class(code) if code in STYLES else "v-unknown"}">{inner}</td>')
        out.append(f'<tr><th class="cell" title="{esc(row.key)}">{esc(row.cell)}</th>{"".join(tds)}</tr>')
    out.append("</tbody></table>")
    return "\n".join(out)


def _counts_table(grid: Grid) -> str:
    head = "".join(f"<th>{_swatch(code)}</th>" for code in CODES)
    out = [f'<table class="counts"><thead><tr><th>#</th><th>combo</th>{head}<th>versions</th></tr></thead><tbody>']
    for col in grid.columns:
        counts = grid.counts(col)
        nums = "".join(f'<td class="n{" zero" if not counts[c] else ""}">{counts[c]}</td>' for c in CODES)
        out.append(
            f"<tr><td>{col.number}</td><td><code>{esc(col.id)}</code>"
            + (f"<br>{esc(col.label)}" if col.label != col.id else "")
            + f'</td>{nums}<td class="ver">{esc(col.versions_text())}</td></tr>'
        )
    out.append("</tbody></table>")
    return "\n".join(out)
