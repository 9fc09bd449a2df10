"""Report: the newest record of every cell in every combo, as one grid, for a terminal, markdown, JSON and JUnit.

The HTML page is in report_html.py. The JSON is what ``diff`` compares between nightlies, so its shape is a contract:
ordered ``columns`` and ``rows``, ``entries[column id][case/cell]`` (one summary per record) and ``counts``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from fsdp_matrix.cells import expand_case
from fsdp_matrix.errors import MatrixError
from fsdp_matrix.matrix import DEFAULT_MATRIX, PACKAGES, Matrix, load_matrix
from fsdp_matrix.records import Record, iter_records, latest
from fsdp_matrix.verdicts import Verdict

LOCAL = "(local)"
"""Column id of records without a combo (a plain pytest run); combo ids cannot start with '(' so it never clashes."""
MISSING = "missing"
"""Code of a grid entry with no record."""
REPORT_SCHEMA = 1

# "!" marks exactly the verdicts that need attention, so a scan of the grid for "!" finds every problem
SYMBOLS: Dict[str, str] = {
    Verdict.REPRODUCED.value: "R", Verdict.FIX_HOLDS.value: "F", Verdict.SKIPPED.value: "-", MISSING: ".",
    Verdict.REGRESSION.value: "!R", Verdict.UNEXPECTED_FIX.value: "!U", Verdict.DIFFERENT_ERROR.value: "!D",
    Verdict.HANG.value: "!H", Verdict.CRASH.value: "!C", Verdict.ENV_ERROR.value: "!E",
}
CODES: Tuple[str, ...] = tuple(SYMBOLS)
"""Display order of verdicts (plus missing) in legends and counts."""
SEVERITY: Tuple[str, ...] = ("REGRESSION", "DIFFERENT-ERROR", "UNEXPECTED-FIX", "crash", "hang", "env-error")
"""Order of the needs-attention list: what most likely means a broken fix first."""
FORMATS = ("text", "md", "html", "json", "junit")
_SHORT = {"torch": "torch", "peft": "peft", "transformers": "tf", "accelerate": "acc", "bitsandbytes": "bnb"}


def symbol(code: str) -> str:
    return SYMBOLS.get(code, "!?")


def needs_attention(code: str) -> bool:
    """Unknown verdict strings (a newer record schema) need attention too rather than passing silently."""
    if code == MISSING:
        return False
    try:
        return Verdict(code).needs_attention
    except ValueError:
        return True


@dataclass(frozen=True)
class Column:
    """One combo of the grid."""

    id: str
    """Combo id from matrix.yaml, or LOCAL for records of a plain pytest run."""
    number: int
    """1-based position; the terminal and HTML headers show it instead of the (long) id."""
    label: str
    """What a reader calls it: the combo id, or the env's peft/transformers versions for a plain run."""
    versions: Dict[str, Optional[str]]
    """Versions reported by the column's newest record."""
    mixed: bool = False
    """Its records come from more than one set of versions (e.g. local runs in several envs)."""

    def versions_text(self) -> str:
        names = [p for p in PACKAGES if p in self.versions] + sorted(set(self.versions) - set(PACKAGES))
        text = " ".join(f"{_SHORT.get(n, n)} {self.versions[n] or '-'}" for n in names)
        return text + (" (mixed versions)" if self.mixed else "")


@dataclass(frozen=True)
class Row:
    """One cell of one case."""

    case: str
    """Case id."""
    cell: str
    """Cell id."""

    @property
    def key(self) -> str:
        return f"{self.case}/{self.cell}"


@dataclass
class Grid:
    """Rows (cells) by columns (combos); an entry is the newest record or missing."""

    columns: List[Column]
    """Ordered as in matrix.yaml when it was given, then by id."""
    rows: List[Row]
    """Ordered by case as in matrix.yaml and by cell as its grids expand, then by id."""
    entries: Dict[Tuple[str, str], Record]
    """(column id, row key) -> newest record."""
    case_titles: Dict[str, str] = field(default_factory=dict)
    """Case id -> title from matrix.yaml, when it was given."""
    unrun: List[str] = field(default_factory=list)
    """Combos of matrix.yaml with no record at all: an env that never reported is worth a line."""
    source: str = ""
    """Where the records were read from."""

    def entry(self, column: Column, row: Row) -> Optional[Record]:
        return self.entries.get((column.id, row.key))

    def code(self, column: Column, row: Row) -> str:
        rec = self.entry(column, row)
        return rec.verdict if rec else MISSING

    def counts(self, column: Column) -> Dict[str, int]:
        found = Counter(self.code(column, row) for row in self.rows)
        return {**{c: found.get(c, 0) for c in CODES}, **{c: n for c, n in found.items() if c not in SYMBOLS}}

    def attention(self) -> List[Tuple[Row, Column, Record]]:
        """Every entry needing attention, most severe verdict first, then in grid order."""
        hits = [(row, col, rec) for row in self.rows for col in self.columns
                if (rec := self.entry(col, row)) is not None and needs_attention(rec.verdict)]
        rank = {v: i for i, v in enumerate(SEVERITY)}
        return sorted(hits, key=lambda h: rank.get(h[2].verdict, -1))  # stable: grid order within a verdict


def build_grid(records: Iterable[Record], matrix: Optional[Matrix] = None, source: str = "") -> Grid:
    newest = latest(iter(records))
    by_col: Dict[str, List[Record]] = {}
    for (combo, _), rec in newest.items():
        by_col.setdefault(combo if combo is not None else LOCAL, []).append(rec)
    combo_pos = {c.id: i for i, c in enumerate(matrix.combos)} if matrix else {}
    order = sorted(by_col, key=lambda c: (combo_pos.get(c, len(combo_pos)), c == LOCAL, _natural(c)))
    columns = [_column(cid, n, by_col[cid]) for n, cid in enumerate(order, 1)]
    rows = {Row(r.case, r.cell): r.world_size for r in newest.values()}
    return Grid(columns, sorted(rows, key=_row_order(matrix, set(rows.items()))),
                {(col, rec.key): rec for col, recs in by_col.items() for rec in recs},
                {c.id: c.title for c in matrix.cases} if matrix else {},
                [c.id for c in matrix.combos if c.id not in by_col] if matrix else [], source)


def _natural(name: str) -> Tuple[Any, ...]:
    """Sort key putting ``torch2.3`` before ``torch2.10``."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name))


def _column(cid: str, number: int, recs: List[Record]) -> Column:
    newest = max(recs, key=lambda r: r.finished_at)
    distinct = {tuple(sorted((k, v or "") for k, v in r.versions.items() if k in PACKAGES)) for r in recs}
    label = cid
    if cid == LOCAL:
        named = [f"{p} {newest.versions[p]}" for p in ("peft", "transformers") if newest.versions.get(p)]
        label = " / ".join(named) or LOCAL
    return Column(cid, number, label, dict(newest.versions), len(distinct) > 1)


def _row_order(matrix: Optional[Matrix], rows: set):
    if matrix is None:
        return lambda row: (row.case, _natural(row.cell))
    case_pos = {c.id: i for i, c in enumerate(matrix.cases)}
    cell_pos: Dict[str, int] = {}
    for case in matrix.cases:
        for ws in sorted({ws for row, ws in rows if row.case == case.id}):
            for i, cell in enumerate(expand_case(case, world_size=ws)):
                cell_pos.setdefault(cell.key, i)
    return lambda row: (case_pos.get(row.case, len(case_pos)), row.case, cell_pos.get(row.key, len(cell_pos)), row.cell)


def load_grid(results: Path, matrix: Optional[Matrix] = None) -> Grid:
    """The grid of every cells.jsonl under ``results`` (or of that one file). Raises OSError/ValueError on bad input."""
    results = Path(results)
    if not results.exists():
        raise FileNotFoundError(f"{results}: no such file or directory")
    return build_grid(iter_records(results), matrix, str(results))


# ---------------------------------------------------------------------------------------------------- text, markdown

def legend() -> str:
    ok = "  ".join(f"{symbol(c)} {c}" for c in CODES if not needs_attention(c) and c != MISSING)
    bad = "  ".join(f"{symbol(c)} {c}" for c in CODES if needs_attention(c))
    return f"Legend: {ok}  . no record  |  needs attention: {bad}"


def _summary_line(grid: Grid) -> str:
    return (f"fsdp-matrix report: {len(grid.rows)} cells x {len(grid.columns)} combos, "
            f"{len(grid.attention())} need attention" + (f" ({grid.source})" if grid.source else ""))


def render_text(grid: Grid, width: int = 3) -> str:
    """The terminal table: cells grouped by case, one numbered column per combo, then the combo key with counts."""
    width = max(width, len(str(len(grid.columns))) + 1)
    name_w = max([len(r.cell) + 2 for r in grid.rows] + [len(r.case) for r in grid.rows] + [10])
    out = [_summary_line(grid), legend(), ""]
    header = " " * name_w + "".join(f"{c.number:>{width}}" for c in grid.columns)
    out.append(header)
    case = None
    for row in grid.rows:
        if row.case != case:
            case = row.case
            title = grid.case_titles.get(case)
            out.append(f"{case}" + (f"  ({title})" if title else ""))
        out.append(f"  {row.cell:<{name_w - 2}}" + "".join(f"{symbol(grid.code(c, row)):>{width}}" for c in grid.columns))
    out += ["", _counts_text(grid)]
    if grid.unrun:
        out.append(f"Combos in matrix.yaml with no record: {', '.join(grid.unrun)}")
    items = grid.attention()
    out += ["", f"Needs attention ({len(items)}):" if items else "Needs attention: nothing."]
    out += [f"  {symbol(rec.verdict):<3}[{col.number} {col.id}] {row.key}: {one_line(rec.line)}" for row, col, rec in items]
    return "\n".join(out) + "\n"


def _counts_text(grid: Grid) -> str:
    id_w = max([len(c.id) for c in grid.columns] + [5])
    head = f"{'#':>3}  {'combo':<{id_w}}" + "".join(f"{symbol(c):>4}" for c in CODES) + "  versions"
    lines = [head]
    for col in grid.columns:
        counts = grid.counts(col)
        extra = "".join(f" {code}:{n}" for code, n in counts.items() if code not in SYMBOLS)
        lines.append(f"{col.number:>3}  {col.id:<{id_w}}" + "".join(f"{counts[c]:>4}" for c in CODES)
                     + f"  {col.versions_text()}{extra}")
    return "\n".join(lines)


# a message may carry terminal escapes (colored logs); shown literally they cannot restyle the reader's terminal
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def one_line(text: Optional[str], limit: int = 400) -> str:
    flat = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", " ".join((text or "").split()))
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+!|~&])")


def md_escape(text: Optional[str], limit: int = 400) -> str:
    """One line of literal text for GitHub markdown: its HTML and table pipes are escaped, never interpreted."""
    return _MD_SPECIAL.sub(r"\\\1", one_line(text, limit))


def render_markdown(grid: Grid) -> str:
    out = ["## fsdp-matrix report", "", md_escape(_summary_line(grid)), "", md_escape(legend()), ""]
    out.append("| cell | " + " | ".join(str(c.number) for c in grid.columns) + " |")
    out.append("|---|" + "---|" * len(grid.columns))
    for row in grid.rows:
        marks = []
        for col in grid.columns:
            code = grid.code(col, row)
            marks.append(f"**{md_escape(symbol(code))}**" if needs_attention(code) else md_escape(symbol(code)))
        out.append(f"| {md_escape(row.key)} | " + " | ".join(marks) + " |")
    out += ["", "| # | combo | " + " | ".join(md_escape(symbol(c)) for c in CODES) + " | versions |",
            "|---|---|" + "---|" * len(CODES) + "---|"]
    for col in grid.columns:
        counts = grid.counts(col)
        out.append(f"| {col.number} | {md_escape(col.label)} | " + " | ".join(str(counts[c]) for c in CODES)
                   + f" | {md_escape(col.versions_text())} |")
    if grid.unrun:
        out += ["", "Combos in matrix.yaml with no record: " + md_escape(", ".join(grid.unrun))]
    items = grid.attention()
    out += ["", f"### Needs attention ({len(items)})" if items else "### Needs attention: nothing", ""]
    out += [f"- **{md_escape(symbol(rec.verdict))}** {md_escape(rec.verdict)} in {col.number} "
            f"\\({md_escape(col.id)}\\) {md_escape(row.key)}: {md_escape(rec.line)}" for row, col, rec in items]
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
        note = "\n\n*(truncated: the whole report is in report.md)*\n".encode()
        data = data[: STEP_SUMMARY_LIMIT - len(note)].decode("utf-8", "ignore").encode() + note
    with open(target, "ab") as fh:
        fh.write(data)
    return Path(target)


# -------------------------------------------------------------------------------------------------------------- JSON

def record_summary(rec: Record) -> Dict[str, Any]:
    obs = rec.observed
    return {"verdict": rec.verdict, "line": rec.line, "status": obs.status, "error_type": obs.error_type,
            "error_message": (obs.error_message or "")[:2000] or None, "location": obs.location,
            "expected": rec.expected, "versions": rec.versions, "device": rec.device, "world_size": rec.world_size,
            "duration_s": rec.duration_s, "run_id": rec.run_id, "host": rec.host, "finished_at": rec.finished_at}


def to_json(grid: Grid) -> Dict[str, Any]:
    return {
        "schema": REPORT_SCHEMA, "generated_at": time.time(), "source": grid.source,
        "columns": [{"id": c.id, "number": c.number, "label": c.label, "versions": c.versions, "mixed": c.mixed}
                    for c in grid.columns],
        "rows": [{"case": r.case, "cell": r.cell} for r in grid.rows],
        "entries": {c.id: {r.key: record_summary(rec) for r in grid.rows if (rec := grid.entry(c, r))}
                    for c in grid.columns},
        "counts": {c.id: grid.counts(c) for c in grid.columns},
        "attention": [{"column": c.id, "cell": r.key, "verdict": rec.verdict} for r, c, rec in grid.attention()],
        "unrun_combos": grid.unrun,
    }



# ---------------------------------------------------------------------------------------------------------- writing

def write_reports(grid: Grid, out: Path, formats: Sequence[str] = FORMATS) -> List[Path]:
    """Write the chosen formats into ``out``; returns the files written."""
    # imported here: both modules build on this one
    from fsdp_matrix.report_html import render_html
    from fsdp_matrix.report_junit import junit_name, junit_xml

    out.mkdir(parents=True, exist_ok=True)
    written: Dict[str, str] = {}
    if "text" in formats:
        written["report.txt"] = render_text(grid)
    if "md" in formats:
        written["report.md"] = render_markdown(grid)
    if "html" in formats:
        written["report.html"] = render_html(grid)
    if "json" in formats:
        written["report.json"] = json.dumps(to_json(grid), indent=1, sort_keys=True, default=str) + "\n"
    paths = []
    for name, text in written.items():
        (out / name).write_text(text, encoding="utf-8")
        paths.append(out / name)
    if "junit" in formats:
        for col in grid.columns:
            (out / junit_name(col)).write_bytes(junit_xml(grid, col))
            paths.append(out / junit_name(col))
    return paths


def _matrix_for(path: Optional[Path]) -> Optional[Matrix]:
    """matrix.yaml only orders rows and columns, so the repo's own is used when none is named and it loads."""
    if path is not None:
        return load_matrix(path)
    if DEFAULT_MATRIX.exists():
        try:
            return load_matrix(DEFAULT_MATRIX)
        except MatrixError as exc:
            print(f"report: ignoring {DEFAULT_MATRIX} for ordering: {exc}", file=sys.stderr)
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m fsdp_matrix report RESULTS [--out DIR] [--matrix FILE] [--format F ...]``; argv excludes 'report'."""
    parser = argparse.ArgumentParser(prog="python -m fsdp_matrix report",
                                     description="Combine cells.jsonl records into one grid of cells x combos.")
    parser.add_argument("results", type=Path, help="results dir (every cells.jsonl under it) or one cells.jsonl")
    parser.add_argument("--out", type=Path, help="where to write the reports (default: RESULTS, or its folder)")
    parser.add_argument("--matrix", type=Path, help="matrix.yaml giving the row/column order (default: the repo's)")
    parser.add_argument("--format", action="append", choices=FORMATS, dest="formats",
                        help="format to write; repeat for several (default: all)")
    args = parser.parse_args(argv)
    try:
        grid = load_grid(args.results, _matrix_for(args.matrix))
    except (OSError, ValueError, MatrixError) as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    if not grid.rows:
        print(f"report: no cell records in {args.results}", file=sys.stderr)
        return 2
    out = args.out or (args.results if args.results.is_dir() else args.results.parent)
    try:
        paths = write_reports(grid, out, args.formats or FORMATS)
    except OSError as exc:
        print(f"report: cannot write to {out}: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render_text(grid))
    if args.formats is None or "md" in args.formats:
        append_step_summary(render_markdown(grid))
    print(f"\nwrote {len(paths)} files to {out}")
    return 0
