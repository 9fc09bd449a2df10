"""The HTML report's details panes, built on demand by a small inline script from one JSON blob.

A full CPU matrix has thousands of entries and about two thousand rank tracebacks, mostly one signature repeated
across combos: one static pane per entry made a 17 MB page. Here each entry is one short row of indices into a
table of distinct strings, and each distinct traceback, stack dump or error message is stored once, keyed by its
signature (``signature``), and put into the page only when its ``<details>`` is opened. The blob is gzipped JSON in
base64 inside a ``<script>`` the browser does not run, so no record text can close the element, and the script
(``DecompressionStream``, in every current browser, from disk too) unpacks it and builds the pane with
``textContent`` only, so no record text becomes markup.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from fsdp_matrix.clip import clip
from fsdp_matrix.expectations import Expected
from fsdp_matrix.records import Record
from fsdp_matrix.report.failure import rank_heading
from fsdp_matrix.report.grid import Column, Grid, Row
from fsdp_matrix.report.style import CODES, needs_attention, symbol

DATA_TYPE = "application/gzip+base64"
"""The type of the ``<script>`` element holding the pane data (a type the browser does not run)."""
TRACE_LIMIT = 8000
"""Characters kept (the tail, where the error is) of each rank's traceback and stack dump."""
# one env's absolute prefix differs per combo (.nox/matrix-<combo>/lib/python3.x/site-packages/): what follows it
# is what identifies the frame, so a traceback repeated across combos is stored once
_SITE = re.compile(r"""(["'\s])(?:[A-Za-z]:)?[/\\][^"'\s]*?[/\\]site-packages[/\\]""")


def shorten(text: str) -> str:
    """``text``'s tail (TRACE_LIMIT), each path into an env's site-packages written from ``site-packages/``."""
    return _SITE.sub(r"\1site-packages/", clip(text, TRACE_LIMIT, tail=True))


def signature(text: str) -> str:
    """The key a stored text goes by: a hash of its shortened form."""
    return hashlib.sha256(shorten(text).encode("utf-8", "surrogatepass")).hexdigest()[:12]


@dataclass
class PaneData:
    """What the script needs to draw every entry's pane, with each repeated string and traceback stored once."""

    strings: List[str] = field(default_factory=list)
    """Distinct short strings (lines, expectations, versions...); entries hold their indices."""
    texts: Dict[str, str] = field(default_factory=dict)
    """Signature -> the shortened traceback, stack dump or error message it stands for."""
    entries: List[List[Any]] = field(default_factory=list)
    """One row per entry, in anchor order (``e-1`` is the first): see ``ENTRY_FIELDS``."""
    _index: Dict[str, int] = field(default_factory=dict)
    """string -> its position in ``strings``."""

    def s(self, value: Any) -> int:
        text = "" if value is None else str(value)
        if text not in self._index:
            self._index[text] = len(self.strings)
            self.strings.append(text)
        return self._index[text]

    def t(self, text: Optional[str]) -> Optional[str]:
        if not text:
            return None
        key = signature(text)
        self.texts.setdefault(key, shorten(text))
        return key


ENTRY_FIELDS = ("title", "verdict", "fields", "message", "ranks")
"""An entry row: its heading, its verdict, ``[[name, value], ...]`` (string indices), the error message's
signature, and per rank ``[heading, error type, traceback signature, stack signature]``."""


def expected_text(rec: Record) -> str:
    try:
        exp = Expected.from_json(rec.expected)
    except TypeError:
        return json.dumps(rec.expected, default=str)
    which = f"platform {exp.platform}" if exp.platform else f"rule {exp.rule}"
    return exp.describe() + (f"  [{which}: {exp.source}]" if exp.source else "")


def when(stamp: float) -> str:
    # a hand-edited or foreign record may hold NaN or a stamp out of the platform's range
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
    except (ValueError, OverflowError, OSError):
        return "unknown time"


def _fields(col: Column, rec: Record) -> List[Tuple[str, str]]:
    obs = rec.observed
    observed = obs.status + (f" · {obs.error_type}" if obs.error_type else "")
    observed += f" in {obs.location}" if obs.location else ""
    where = f"{rec.device}, world size {rec.world_size}" + (f" on {rec.nodes} nodes" if rec.nodes > 1 else "")
    where += f", {rec.duration_s:.1f}s, host {rec.host}, run {rec.run_id or '-'}, at {when(rec.finished_at)}"
    out = [
        ("verdict", rec.verdict),
        ("combo", f"{col.number} {col.id}" + (f" {col.label}" if col.label != col.id else "")),
        ("line", rec.line),
        ("expected", expected_text(rec)),
        ("observed", observed),
        ("versions", " ".join(f"{k} {v or '-'}" for k, v in sorted(rec.versions.items()))),
        ("run", where),
        ("params", json.dumps(rec.params, sort_keys=True, default=str)),
    ]
    if obs.checks:
        out.append(("checks", json.dumps(obs.checks, sort_keys=True, default=str)))
    return out


def add_entry(data: PaneData, col: Column, row: Row, rec: Record) -> None:
    title = f"{row.key} · {col.label}"
    fields = [[data.s(k), data.s(v)] for k, v in _fields(col, rec)]
    ranks = [
        [data.s(rank_heading(r)), data.s(r.error_type), data.t(r.traceback), data.t(r.stack)]
        for r in rec.observed.ranks
    ]
    data.entries.append([data.s(title), data.s(rec.verdict), fields, data.t(rec.observed.error_message), ranks])


def pane_data(grid: Grid) -> Tuple[Dict[Tuple[str, str], str], PaneData]:
    """Every recorded entry's anchor (``e-N``) and the data of its pane."""
    anchors: Dict[Tuple[str, str], str] = {}
    data = PaneData()
    for row in grid.rows:
        for col in grid.columns:
            rec = grid.entry(col, row)
            if rec is not None:
                anchors[(col.id, row.key)] = f"e-{len(anchors) + 1}"
                add_entry(data, col, row, rec)
    return anchors, data


def data_element(data: PaneData) -> str:
    """The pane data as gzip in base64: nothing a record holds can close the element, and a full matrix's data
    (3.9 MB of JSON for 3,874 entries) takes 0.25 MB of page. ``mtime=0``: the same records give the same page."""
    blob = {
        "s": data.strings,
        "t": data.texts,
        "e": data.entries,
        "att": [c for c in CODES if needs_attention(c)],
        "known": list(CODES),
        "sym": {c: symbol(c) for c in CODES},
    }
    # ASCII JSON: a lone surrogate from a lossless record is written as its \u escape, which JSON.parse reads
    raw = json.dumps(blob, separators=(",", ":"), default=str).encode("ascii")
    packed = base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")
    return f'<script type="{DATA_TYPE}" id="report-data">{packed}</script>'


def read_data(page: str) -> Dict[str, Any]:
    """The pane data of a page ``data_element`` wrote (what the script unpacks; tests read it back with this)."""
    match = re.search(rf'<script type="{re.escape(DATA_TYPE)}" id="report-data">([^<]*)</script>', page)
    if not match:
        raise ValueError("no pane data in this page")
    return json.loads(gzip.decompress(base64.b64decode(match.group(1))))


SCRIPT = """
(function () {
  var pane = document.getElementById("pane");
  if (typeof DecompressionStream === "undefined") {
    pane.textContent = "This browser cannot unpack the details (no DecompressionStream); the grid above is complete.";
    pane.hidden = false;
    return;
  }
  var packed = atob(document.getElementById("report-data").textContent.trim());
  var bytes = new Uint8Array(packed.length);
  for (var i = 0; i < packed.length; i++) bytes[i] = packed.charCodeAt(i);
  var text = new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"))).text();
  text.then(function (json) { start(JSON.parse(json)); });
  function start(D) {
  var S = D.s;
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function cls(v) { return D.known.indexOf(v) < 0 ? "v-unknown" : "v-" + v.toLowerCase().replace(/[^a-z0-9]+/g, "-"); }
  function swatch(v) { return el("span", D.sym[v] || "!?", "sw " + cls(v)); }
  function attention(v) { return D.att.indexOf(v) >= 0 || D.known.indexOf(v) < 0; }
  function text(name, sig, open) {
    // the stored text goes into the page when its block is opened, not before
    var d = el("details"), pre = el("pre");
    d.appendChild(el("summary", name));
    d.appendChild(pre);
    d.addEventListener("toggle", function () { if (d.open && !pre.textContent) pre.textContent = D.t[sig]; });
    d.open = open;
    return d;
  }
  function show() {
    var m = /^#e-(\\d+)$/.exec(location.hash), e = m ? D.e[+m[1] - 1] : null;
    if (!e) { pane.hidden = true; return; }
    var verdict = S[e[1]], open = attention(verdict), h = el("h3"), dl = el("dl");
    pane.replaceChildren(el("a", "\\u00d7", "close"));
    pane.firstChild.href = "#";
    h.appendChild(swatch(verdict)); h.appendChild(el("code", " " + S[e[0]]));
    pane.appendChild(h);
    e[2].forEach(function (f) { dl.appendChild(el("dt", S[f[0]])); dl.appendChild(el("dd", S[f[1]])); });
    pane.appendChild(dl);
    if (e[3]) pane.appendChild(text("error message", e[3], true));
    e[4].forEach(function (r) {
      var head = el("div"); head.appendChild(el("b", S[r[0]]));
      if (S[r[1]]) head.appendChild(el("code", " \\u00b7 " + S[r[1]]));
      pane.appendChild(head);
      if (r[2]) pane.appendChild(text("traceback", r[2], open));
      if (r[3]) pane.appendChild(text("stacks", r[3], open));
    });
    pane.hidden = false;
  }
  document.querySelector("table.grid").addEventListener("mouseover", function (ev) {
    var a = ev.target.closest ? ev.target.closest("td.v a") : null, m = a && /^#e-(\\d+)$/.exec(a.getAttribute("href"));
    if (m && !a.title) { var e = D.e[+m[1] - 1]; a.title = S[e[1]] + ": " + S[e[0]] + "\\n" + S[e[2][2][1]]; }
  });
  window.addEventListener("hashchange", show);
  show();
  }
})();
"""
"""Unpacks the data, then draws the pane of ``#e-N`` from it and fills a tooltip on first hover; record text goes in
only via textContent."""


def script_elements(data: PaneData) -> str:
    return data_element(data) + f"\n<script>{SCRIPT}</script>"
