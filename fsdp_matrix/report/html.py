"""The report as one self-contained HTML page: a colored grid of cells x combos and a details pane per entry.

No script and no external asset: a grid entry links to ``#e-N`` and CSS ``:target`` shows that entry's pane, so the
page works from a CI artifact or a mail attachment. Every string from a record goes through ``esc`` (html.escape with
quotes): error messages carry ``<``, ``>``, ``&``, quotes and backticks.
"""

from __future__ import annotations

import html
import json
import re
import time
from typing import Any, Dict, List, Optional, Tuple

from fsdp_matrix.clip import clip
from fsdp_matrix.expectations import Expected
from fsdp_matrix.records import Record
from fsdp_matrix.report.failure import rank_heading
from fsdp_matrix.report.grid import Column, Grid, Row
from fsdp_matrix.report.style import CODES, MISSING, STYLES, legend, needs_attention, style, symbol

TRACE_LIMIT = 8000
"""Characters kept (the tail, where the error is) of each rank's traceback and stack dump."""


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
.att .sw { font: 600 12px ui-monospace, monospace; padding: 0 4px; border-radius: 3px; }
.att code, .pane code { font: 12px ui-monospace, Menlo, Consolas, monospace; }
.pane { display: none; position: fixed; left: 0; right: 0; bottom: 0; max-height: 42vh; overflow: auto;
  background: #fff; border-top: 3px solid #424242; box-shadow: 0 -4px 14px rgba(0,0,0,.18); padding: 10px 20px;
  z-index: 5; }
.pane:target { display: block; }
.pane h3 { margin: 0 0 6px; font-size: 15px; } .pane .close { float: right; font-size: 18px; text-decoration: none; }
.pane dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 6px 0; }
.pane dt { color: #616161; } .pane dd { margin: 0; word-break: break-word; }
.pane pre { background: #f7f7f7; border: 1px solid #e0e0e0; padding: 6px 8px; white-space: pre-wrap;
  font: 12px/1.35 ui-monospace, Menlo, Consolas, monospace; max-height: 30vh; overflow: auto; }
.muted { color: #9e9e9e; }
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


def _tooltip(col: Column, row: Row, rec: Optional[Record]) -> str:
    if rec is None:
        return f"{row.key}\n{col.label}: no record"
    return f"{rec.verdict}: {row.key}\n{col.label}\n{rec.line}\n{col.versions_text()}"


def render_html(grid: Grid) -> str:
    anchors: Dict[Tuple[str, str], str] = {}
    panes: List[str] = []
    for row in grid.rows:
        for col in grid.columns:
            rec = grid.entry(col, row)
            if rec is not None:
                anchors[(col.id, row.key)] = f"e-{len(anchors) + 1}"
                panes.append(_pane(anchors[(col.id, row.key)], col, row, rec))
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
    body += panes
    body.append("</body></html>")
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
            tip = esc(_tooltip(col, row, rec))
            inner = (
                f'<a href="#{anchors[(col.id, row.key)]}" title="{tip}">{esc(symbol(code))}</a>'
                if rec
                else f'<span title="{tip}">{esc(symbol(code))}</span>'
            )
            cls = _css_class(code) if code in STYLES else ""
            look = "" if cls else f' style="background:{style(code).background};color:{style(code).color}"'
            tds.append(f'<td class="v {cls}"{look}>{inner}</td>')
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


def _expected_text(rec: Record) -> str:
    try:
        exp = Expected.from_json(rec.expected)
    except TypeError:
        return json.dumps(rec.expected, default=str)
    which = f"platform {exp.platform}" if exp.platform else f"rule {exp.rule}"
    return exp.describe() + (f"  [{which}: {exp.source}]" if exp.source else "")


def _tail(text: str) -> str:
    return clip(text, TRACE_LIMIT, tail=True)


def _when(stamp: float) -> str:
    # a hand-edited or foreign record may hold NaN or a stamp out of the platform's range
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
    except (ValueError, OverflowError, OSError):
        return "unknown time"


def _pane(anchor: str, col: Column, row: Row, rec: Record) -> str:
    obs = rec.observed
    fields = [
        ("verdict", _swatch(rec.verdict) + " " + esc(rec.verdict)),
        ("combo", f"{col.number} <code>{esc(col.id)}</code> {esc(col.label) if col.label != col.id else ''}"),
        ("line", f"<code>{esc(rec.line)}</code>"),
        ("expected", esc(_expected_text(rec))),
        (
            "observed",
            esc(obs.status)
            + (f" &middot; <code>{esc(obs.error_type)}</code>" if obs.error_type else "")
            + (f" in <code>{esc(obs.location)}</code>" if obs.location else ""),
        ),
        ("versions", "<code>" + esc(" ".join(f"{k} {v or '-'}" for k, v in sorted(rec.versions.items()))) + "</code>"),
        (
            "run",
            esc(
                f"{rec.device}, world size {rec.world_size}"
                + (f" on {rec.nodes} nodes" if rec.nodes > 1 else "")
                + f", {rec.duration_s:.1f}s, host {rec.host}, "
                f"run {rec.run_id or '-'}, at {_when(rec.finished_at)}"
            ),
        ),
        ("params", "<code>" + esc(json.dumps(rec.params, sort_keys=True, default=str)) + "</code>"),
    ]
    if obs.checks:
        fields.append(("checks", "<code>" + esc(json.dumps(obs.checks, sort_keys=True, default=str)) + "</code>"))
    out = [
        f'<section class="pane" id="{anchor}"><a class="close" href="#" title="close">&times;</a>',
        f"<h3>{_swatch(rec.verdict)} <code>{esc(row.key)}</code> &middot; {esc(col.label)}</h3>",
        "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in fields) + "</dl>",
    ]
    if obs.error_message:
        out.append(f"<b>error message</b><pre>{esc(_tail(obs.error_message))}</pre>")
    for rank in obs.ranks:
        out.append(
            f"<div><b>{esc(rank_heading(rank))}</b>"
            + (f" &middot; <code>{esc(rank.error_type)}</code>" if rank.error_type else "")
            + "</div>"
        )
        for name, text in (("traceback", rank.traceback), ("stacks", rank.stack)):
            if text:
                out.append(
                    f"<details{' open' if needs_attention(rec.verdict) else ''}><summary>{name}</summary>"
                    f"<pre>{esc(_tail(text))}</pre></details>"
                )
    out.append("</section>")
    return "\n".join(out)
