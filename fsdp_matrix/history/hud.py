"""The HUD: one static HTML page over the history DB, a cell x night grid per combo.

Per combo: the cells as rows, the last N nights as columns (each entry the night's verdict, ``~`` marking a flip its
reruns called flaky), since when each cell red on the last night has been red, and the first changed release or
commit (and its PR) where a bisect named one. Absence is never "still red": a cell or a whole combo with no record on
the newest night is an alert of its own (``main: no record since 2026-11-26``), and so is a verdict that became
``skipped`` (a skip hides the cell); the page's title and the CLI's line count each kind. A small inline script
filters the rows by case, combo and redness; the page has no external asset and needs no server, so it works opened
from disk or as a CI artifact.
"""

from __future__ import annotations

import html
import itertools
import json
import sqlite3
import time
from collections import defaultdict
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from fsdp_matrix.confirm import FLAKY
from fsdp_matrix.history.db import connect
from fsdp_matrix.report.style import CODES, MISSING, STYLES, needs_attention, symbol
from fsdp_matrix.verdicts import Verdict

Key = Tuple[str, str, str]
"""(combo, case, cell)."""


@dataclass(frozen=True)
class Entry:
    """One cell on one night."""

    verdict: str
    """The night's verdict."""
    confirmation: Optional[str] = None
    """What the reruns of its flip said (flaky, confirmed...), or None."""
    signature: Optional[str] = None
    """Its error signature."""

    @property
    def red(self) -> bool:
        """Needs attention, and not a flip its reruns did not repeat."""
        return needs_attention(self.verdict) and self.confirmation != FLAKY


@dataclass
class HudRow:
    """One cell of one combo over the nights shown."""

    combo: str
    """Combo column id."""
    case: str
    """Case id."""
    cell: str
    """Cell id."""
    entries: List[Optional[Entry]]
    """Per night shown (oldest first): its entry, or None when that night has no record of it."""
    since: Optional[str] = None
    """When red on the newest night: the first night of that red streak (over every night kept)."""
    culprit: Optional[str] = None
    """The first changed release or commit (and PR) the newest bisect named for it."""
    silent_since: Optional[str] = None
    """When the newest night has no record of it: the last night that has one (its last verdict is not "red now")."""
    was: Optional[str] = None
    """When its verdict on the newest night is ``skipped`` and its record before was not: that verdict."""

    @property
    def alert(self) -> bool:
        """Red now, silent on the newest night, or newly skipped."""
        return bool(self.since or self.silent_since or self.was)


@dataclass
class Hud:
    """What the page shows."""

    nights: List[str]
    """The nights shown, oldest first."""
    rows: List[HudRow] = field(default_factory=list)
    """Every cell of every combo with a record on one of those nights, by combo, case and cell."""
    versions: Dict[str, str] = field(default_factory=dict)
    """combo -> the versions (and commits) it ran with on the newest night shown that has it."""
    silent: Dict[str, str] = field(default_factory=dict)
    """combo -> the last night with a record of it, for each combo of the DB with no record on the newest night."""

    def alerts(self) -> str:
        """``2 red, 1 combo silent, 3 cells silent, 1 newly skipped`` (the kinds with none are left out but red)."""
        red = sum(1 for r in self.rows if r.since)
        cells = sum(1 for r in self.rows if r.silent_since and r.combo not in self.silent)
        skipped = sum(1 for r in self.rows if r.was)
        out = [f"{red} red"]
        out += [f"{len(self.silent)} combo{'s' if len(self.silent) != 1 else ''} silent"] if self.silent else []
        out += [f"{cells} cell{'s' if cells != 1 else ''} silent"] if cells else []
        return ", ".join(out + ([f"{skipped} newly skipped"] if skipped else []))


def _back(db: sqlite3.Connection, key: Key, before: Tuple[float, str]) -> Iterator[Tuple[str, Entry]]:
    """The cell's records on the nights before ``before`` ((ran_at, night) of the first night shown), newest first,
    read one at a time as the caller walks back (the index ``cells_by_cell`` finds them)."""
    query = (
        "SELECT c.night, c.verdict, c.confirmation, c.signature FROM cells c JOIN nights n ON n.night = c.night "
        "WHERE c.combo = ? AND c.case_id = ? AND c.cell = ? AND (n.ran_at < ? OR (n.ran_at = ? AND n.night < ?)) "
        "ORDER BY n.ran_at DESC, n.night DESC"
    )
    for night, verdict, confirmation, sig in db.execute(query, (*key, before[0], before[0], before[1])):
        yield night, Entry(verdict, confirmation, sig)


def _since(newest_first: Iterable[Tuple[str, Entry]]) -> Optional[str]:
    """The first night of the red streak that ends at the newest entry (entries newest first; stops at the first
    entry that is not red)."""
    first = None
    for night, entry in newest_first:
        if not entry.red:
            break
        first = night
    return first


def _previous(newest_first: Iterable[Tuple[str, Entry]]) -> Optional[str]:
    """The verdict before the newest entry when the newest became ``skipped``, else None."""
    it = iter(newest_first)
    newest = next(it, None)
    if newest is None or newest[1].verdict != Verdict.SKIPPED.value:
        return None  # decided before the entry before it is read (it may be on a night not shown)
    before = next(it, None)
    return None if before is None or before[1].verdict == Verdict.SKIPPED.value else before[1].verdict


def _silent_combos(db: sqlite3.Connection, newest: Optional[str]) -> Dict[str, str]:
    """combo -> its last night, for each combo with no row in ``combos`` on the ``newest`` night."""
    last: Dict[str, str] = {}
    query = "SELECT c.combo, n.night FROM combos c JOIN nights n ON n.night = c.night ORDER BY n.ran_at, n.night"
    for combo, night in db.execute(query):
        last[combo] = night
    return {c: n for c, n in sorted(last.items()) if n != newest}


def _culprits(db: sqlite3.Connection) -> Dict[Tuple[str, str], str]:
    out: Dict[Tuple[str, str], str] = {}
    query = (
        "SELECT c.combo, c.cell, c.package, c.kind, c.changed, c.subject, c.pr FROM culprits c "
        "JOIN nights n ON n.night = c.night ORDER BY n.ran_at"
    )
    for combo, cell, package, kind, changed, subject, pr in db.execute(query):
        text = f"{package} {changed}" if kind == "release" else f"{package} {changed[:10]} {subject or ''}".strip()
        out[(combo, cell)] = text + (f" (PR #{pr})" if pr and f"#{pr}" not in text else "")
    return out


def _versions(db: sqlite3.Connection, nights: List[str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for night in nights:
        for combo, versions, sources in db.execute(
            "SELECT combo, versions, sources FROM combos WHERE night = ?", (night,)
        ):
            text = " ".join(f"{k} {v or '-'}" for k, v in sorted(json.loads(versions or "{}").items()))
            srcs = json.loads(sources or "{}")
            text += "".join(f"; {p} @ {str(s.get('commit'))[:10]}" for p, s in sorted(srcs.items()))
            out[combo] = text
    return out


MAX_NIGHTS = 100
"""``--nights`` at most: a page of 4,000 cells grows by about 0.34 MB per night shown (34 MB at 100)."""
_SHOWN = "SELECT night, ran_at FROM nights ORDER BY ran_at DESC, night DESC LIMIT ?"


def _window(db: sqlite3.Connection, last: int) -> Dict[Key, Dict[str, Entry]]:
    """Each cell's entries on the ``last`` newest nights: the only rows of ``cells`` read whole."""
    query = (
        "SELECT night, combo, case_id, cell, verdict, confirmation, signature FROM cells "
        "WHERE night IN (SELECT night FROM (" + _SHOWN + "))"
    )
    out: Dict[Key, Dict[str, Entry]] = defaultdict(dict)
    for night, combo, case, cell, verdict, confirmation, sig in db.execute(query, (last,)):
        out[(combo, case, cell)][night] = Entry(verdict, confirmation, sig)
    return out


def _hud_row(db: sqlite3.Connection, key: Key, on: Dict[str, Entry], shown: List[Tuple[str, float]]) -> HudRow:
    """The row of one cell with an entry on a night shown; its red streak and its verdict before a skip are read
    further back only when the nights shown do not settle them."""
    row = HudRow(*key, [on.get(n) for n, _ in shown])
    seen = [(n, on[n]) for n, _ in reversed(shown) if n in on]  # newest first
    if row.entries[-1] is None:  # absence is not "still red": its last record is from an earlier night
        row.silent_since = seen[0][0]
        return row
    first = (shown[0][1], shown[0][0])
    row.since = _since(itertools.chain(seen, _back(db, key, first)))
    row.was = _previous(itertools.chain(seen, _back(db, key, first)))
    return row


def load_hud(path: Path, last: int = 14) -> Hud:
    """The HUD of the DB at ``path`` over its ``last`` nights (1 to ``MAX_NIGHTS``). SQL selects the rows: the
    nights shown, and each red (or newly skipped) cell's records back to where its streak began."""
    if not 1 <= last <= MAX_NIGHTS:
        raise ValueError(f"last: {last} nights; give 1 to {MAX_NIGHTS}")
    with closing(connect(path)) as db:
        shown = [(n, t) for n, t in reversed(db.execute(_SHOWN, (last,)).fetchall())]
        names = [n for n, _ in shown]
        hud = Hud(names, versions=_versions(db, names), silent=_silent_combos(db, names[-1] if names else None))
        culprits = _culprits(db)
        for key, on in sorted(_window(db, last).items()):
            row = _hud_row(db, key, on, shown)
            row.culprit = culprits.get((key[0], f"{key[1]}/{key[2]}"))
            hud.rows.append(row)
    return hud


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _class(code: str) -> str:
    return "v-" + "".join(ch if ch.isalnum() else "-" for ch in code.lower())


def _td(night: str, entry: Optional[Entry]) -> str:
    if entry is None:
        return f'<td class="v {_class(MISSING)}" title="{esc(night)}: no record">{esc(symbol(MISSING))}</td>'
    flaky = entry.confirmation == FLAKY
    tip = f"{night}: {entry.verdict}" + (f" ({entry.confirmation})" if entry.confirmation else "")
    tip += f"\n{entry.signature}" if entry.signature else ""
    cls = _class(entry.verdict) if entry.verdict in STYLES else "v-unknown"
    mark = '<span class="fl">~</span>' if flaky else ""
    return f'<td class="v {cls}{" flaky" if flaky else ""}" title="{esc(tip)}">{esc(symbol(entry.verdict))}{mark}</td>'


def _since_text(row: HudRow) -> str:
    if row.silent_since:
        return f"no record since {row.silent_since}"
    return f"skipped (was {row.was})" if row.was else row.since or ""


def _row(row: HudRow, nights: List[str]) -> str:
    red = bool(row.since)
    flaky = any(e is not None and e.confirmation == FLAKY for e in row.entries)
    attrs = f'data-combo="{esc(row.combo)}" data-case="{esc(row.case)}" data-red="{int(red)}" data-flaky="{int(flaky)}"'
    attrs += f' data-alert="{int(row.alert)}"'
    tds = "".join(_td(n, e) for n, e in zip(nights, row.entries))
    since = f'<td class="since">{esc(_since_text(row))}</td>'
    return (
        f'<tr {attrs}><th class="cell" title="{esc(row.case)}/{esc(row.cell)}">{esc(row.case)}/<b>{esc(row.cell)}</b>'
        f'</th>{tds}{since}<td class="culprit">{esc(row.culprit or "")}</td></tr>'
    )


CSS = """
body { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px 20px; color: #212121; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 15px; margin: 18px 0 2px; }
.sub, .ver { color: #616161; } .ver { font: 11px ui-monospace, Menlo, Consolas, monospace; margin-bottom: 4px; }
.filters { display: flex; gap: 14px; align-items: center; margin: 10px 0; flex-wrap: wrap; }
table { border-collapse: collapse; } th, td { border: 1px solid #e0e0e0; }
thead th { background: #fafafa; font: 11px ui-monospace, Menlo, Consolas, monospace; padding: 2px 4px; }
th.cell { text-align: left; font: 12px ui-monospace, Menlo, Consolas, monospace; font-weight: normal;
  padding: 1px 8px; white-space: nowrap; }
td.v { text-align: center; font: 600 12px ui-monospace, Menlo, Consolas, monospace; min-width: 30px; }
td.flaky { outline: 2px dashed #ff6f00; outline-offset: -3px; } .fl { color: #ff6f00; font-weight: 700; }
td.since { font: 12px ui-monospace, monospace; color: #b71c1c; white-space: nowrap; padding: 0 6px; }
td.culprit { font: 12px ui-monospace, monospace; padding: 0 6px; }
.alert { color: #b71c1c; font-weight: 600; }
.legend span { display: inline-block; padding: 0 4px; margin-right: 6px; border-radius: 3px; }
tr[hidden], section[hidden] { display: none; }
"""

SCRIPT = """
(function () {
  var caseBox = document.getElementById("f-case"), comboBox = document.getElementById("f-combo");
  var redBox = document.getElementById("f-red"), flakyBox = document.getElementById("f-flaky");
  var alertBox = document.getElementById("f-alert");
  function apply() {
    var c = caseBox.value.trim().toLowerCase(), k = comboBox.value, shown = 0;
    document.querySelectorAll("section.combo").forEach(function (sec) {
      var any = false;
      sec.querySelectorAll("tbody tr").forEach(function (tr) {
        var ok = (!c || tr.dataset.case.toLowerCase().indexOf(c) >= 0) && (!k || tr.dataset.combo === k)
          && (!redBox.checked || tr.dataset.red === "1") && (!flakyBox.checked || tr.dataset.flaky === "1")
          && (!alertBox.checked || tr.dataset.alert === "1");
        tr.hidden = !ok; if (ok) { any = true; shown++; }
      });
      sec.hidden = !any;
    });
    document.getElementById("f-count").textContent = shown + " rows shown";
  }
  [caseBox, comboBox, redBox, flakyBox, alertBox].forEach(function (el) { el.addEventListener("input", apply); });
  apply();
})();
"""
"""Hides the rows (and the combos left empty) that the filters leave out; the page needs nothing else."""


def _palette() -> str:
    rules = [f".{_class(c)} {{ background: {s.background}; color: {s.color}; }}" for c, s in STYLES.items()]
    return "\n".join(rules + [".v-unknown { background: #000; color: #ff0; }"])


def _filters(hud: Hud) -> str:
    combos = sorted({r.combo for r in hud.rows})
    cases = sorted({r.case for r in hud.rows})
    options = "".join(f'<option value="{esc(c)}">{esc(c)}</option>' for c in combos)
    listed = "".join(f'<option value="{esc(c)}">' for c in cases)
    return (
        '<div class="filters"><label>case <input id="f-case" list="cases" placeholder="any case"></label>'
        f'<datalist id="cases">{listed}</datalist>'
        f'<label>combo <select id="f-combo"><option value="">any combo</option>{options}</select></label>'
        '<label><input type="checkbox" id="f-red"> red only</label>'
        '<label><input type="checkbox" id="f-alert"> alerts only (red, silent, newly skipped)</label>'
        '<label><input type="checkbox" id="f-flaky"> flaky only</label><span id="f-count" class="sub"></span></div>'
    )


def _section(combo: str, rows: List[HudRow], hud: Hud) -> str:
    head = "".join(f"<th>{esc(n)}</th>" for n in hud.nights)
    body = "\n".join(_row(r, hud.nights) for r in rows)
    red = sum(1 for r in rows if r.since)
    cells = f"{len(rows)} cell{'s' if len(rows) != 1 else ''}"
    silent = f' &middot; <b class="alert">no record since {esc(hud.silent[combo])}</b>' if combo in hud.silent else ""
    return (
        f'<section class="combo" data-combo="{esc(combo)}"><h2>{esc(combo)} <span class="sub">{cells}, '
        f'{red} red{silent}</span></h2><div class="ver">{esc(hud.versions.get(combo, ""))}</div>'
        f"<table><thead><tr><th>cell</th>{head}<th>red since</th><th>first changed (bisect)</th></tr></thead>"
        f"<tbody>\n{body}\n</tbody></table></section>"
    )


def render_hud(hud: Hud, source: str = "") -> str:
    by_combo: Dict[str, List[HudRow]] = defaultdict(list)
    for row in hud.rows:
        by_combo[row.combo].append(row)
    flaky = sum(1 for r in hud.rows if any(e is not None and e.confirmation == FLAKY for e in r.entries))
    legend = "".join(f'<span class="{_class(c)}">{esc(symbol(c))} {esc(STYLES[c].label or c)}</span>' for c in CODES)
    generated = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    body = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">',
        f"<title>fsdp-matrix HUD: {esc(hud.alerts())}</title><style>{CSS}\n{_palette()}</style></head><body>",
        "<h1>fsdp-matrix HUD</h1>",
        f'<div class="sub">{len(hud.nights)} nights ({esc(hud.nights[0] if hud.nights else "-")} to '
        f"{esc(hud.nights[-1] if hud.nights else '-')}) &middot; {len(by_combo)} combos &middot; {len(hud.rows)} "
        f"cells &middot; <b>{esc(hud.alerts())}</b> &middot; {flaky} with a flaky night &middot; {esc(source)} "
        f"&middot; generated {esc(generated)}</div>",
        *(f'<div class="alert">{esc(c)}: no record since {esc(n)}</div>' for c, n in hud.silent.items()),
        f'<div class="legend">{legend} <span class="flaky-key"><span class="fl">~</span> flaky: the reruns did not '
        "repeat the flip (no alert)</span></div>",
        _filters(hud),
    ]
    body += [_section(c, rows, hud) for c, rows in sorted(by_combo.items())]
    body += [f"<script>{SCRIPT}</script>", "</body></html>"]
    return "\n".join(body) + "\n"
