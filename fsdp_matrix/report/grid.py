"""The report's model: the newest record of every cell in every combo, as rows (cells) by columns (combos).

Every renderer (text, markdown, HTML, JSON, JUnit) reads a Grid; none reads records itself.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from fsdp_matrix.cells import expand_case
from fsdp_matrix.envs.sources import shown
from fsdp_matrix.matrix import PACKAGES, Matrix
from fsdp_matrix.records import Record, Skipped, iter_records, latest
from fsdp_matrix.report.style import CODES, MISSING, STYLES, needs_attention, severity

ENV_ERROR = "env-error"
LOCAL = "(local)"
"""Column id of records without a combo (a plain pytest run); combo ids cannot start with '(' so it never clashes."""
_SHORT = {"torch": "torch", "peft": "peft", "transformers": "tf", "accelerate": "acc", "bitsandbytes": "bnb"}


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
    sources: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    """Packages its newest record built from source: ``{pkg: {url, ref, commit, dirty, release}}`` (the nightly
    bisects the commits that moved between two nights)."""

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


@dataclass(frozen=True)
class EnvFailure:
    """The cells of one combo that got env-error for one reason: reported once, not once per cell."""

    column: Column
    """The combo."""
    reason: str
    """The installer's (or torchrun's) message."""
    rows: Tuple[Row, ...]
    """The cells it cost, in grid order."""
    rerun: str
    """The command that runs them again once the cause is fixed (``--resume`` re-runs env-error cells only)."""


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
    skipped: List[Skipped] = field(default_factory=list)
    """Lines of cells.jsonl that are not records (torn by a killed run, wrong-typed): every renderer counts them."""
    sessions: Dict[str, str] = field(default_factory=dict)
    """Column id -> the nox session that runs that combo, for the combos of matrix.yaml."""
    gone: List[str] = field(default_factory=list)
    """Row keys of cells matrix.yaml no longer has (a case or grid removed or renamed): listed apart, never under
    "Needs attention"; ``report RESULTS --prune`` moves their records aside."""

    def skipped_text(self) -> str:
        """``2 lines of cells.jsonl could not be read``, or empty when every line was a record."""
        n = len(self.skipped)
        return f"{n} line{'s' if n != 1 else ''} of cells.jsonl could not be read" if n else ""

    def entry(self, column: Column, row: Row) -> Optional[Record]:
        return self.entries.get((column.id, row.key))

    def code(self, column: Column, row: Row) -> str:
        rec = self.entry(column, row)
        return rec.verdict if rec else MISSING

    def counts(self, column: Column) -> Dict[str, int]:
        found = Counter(self.code(column, row) for row in self.rows)
        return {**{c: found.get(c, 0) for c in CODES}, **{c: n for c, n in found.items() if c not in STYLES}}

    def attention(self) -> List[Tuple[Row, Column, Record]]:
        """Every entry needing attention, most severe verdict first, then in grid order."""
        hits = [
            (row, col, rec)
            for row in self.rows
            for col in self.columns
            if (rec := self.entry(col, row)) is not None and needs_attention(rec.verdict) and row.key not in self.gone
        ]
        return sorted(hits, key=lambda h: severity(h[2].verdict))  # stable: grid order within a verdict

    def attention_cells(self) -> List[Tuple[Row, Column, Record]]:
        """``attention()`` less the env-error entries, which ``env_failures`` reports once per combo and reason."""
        return [hit for hit in self.attention() if hit[2].verdict != ENV_ERROR]

    def env_failures(self) -> List[EnvFailure]:
        """The env-error entries grouped by combo and reason, in column order."""
        groups: Dict[Tuple[str, str], List[Row]] = {}
        built: Dict[Tuple[str, str], Dict[str, Dict[str, Any]]] = {}
        for row, col, rec in self.attention():
            if rec.verdict == ENV_ERROR:
                reason = rec.observed.error_message or rec.observed.error_type or rec.line or "no reason recorded"
                groups.setdefault((col.id, reason), []).append(row)
                built.setdefault((col.id, reason), rec.sources)
        cols = {c.id: c for c in self.columns}
        out = [
            EnvFailure(cols[cid], reason, tuple(rows), self._rerun(cid, built[cid, reason]))
            for (cid, reason), rows in groups.items()
        ]
        return sorted(out, key=lambda f: f.column.number)

    def _rerun(self, column: str, sources: Dict[str, Dict[str, Any]]) -> str:
        if column not in self.sessions:
            return "the same run again with --resume"
        # an env built from --pin sources is rerun with them: without, the release env would answer instead
        pins = [
            shlex.quote(f"{name}={src['url']}" + (f"@{src['ref']}" if src.get("ref") else ""))
            for name, src in sources.items()
            if src.get("url")
        ]
        return " ".join([f'nox -s "{self.sessions[column]}" -- --resume', *(f"--pin {p}" for p in pins)])


def build_grid(
    records: Iterable[Record], matrix: Optional[Matrix] = None, source: str = "", skipped: Iterable[Skipped] = ()
) -> Grid:
    newest = latest(iter(records))
    by_col: Dict[str, List[Record]] = {}
    for (combo, _), rec in newest.items():
        by_col.setdefault(combo if combo is not None else LOCAL, []).append(rec)
    combo_pos = {c.id: i for i, c in enumerate(matrix.combos)} if matrix else {}
    order = sorted(by_col, key=lambda c: (combo_pos.get(c, len(combo_pos)), c == LOCAL, _natural(c)))
    columns = [_column(cid, n, by_col[cid]) for n, cid in enumerate(order, 1)]
    rows = {Row(r.case, r.cell): (r.world_size, r.nodes) for r in newest.values()}
    return Grid(
        columns,
        sorted(rows, key=_row_order(matrix, set(rows.items()))),
        {(col, rec.key): rec for col, recs in by_col.items() for rec in recs},
        {c.id: c.title for c in matrix.cases} if matrix else {},
        [c.id for c in matrix.combos if c.id not in by_col] if matrix else [],
        source,
        list(skipped),
        {c.id: f"{c.session}({c.id})" for c in matrix.combos} if matrix else {},
        _gone(matrix, rows) if matrix else [],
    )


def _gone(matrix: Matrix, rows: Dict[Row, Tuple[int, int]]) -> List[str]:
    """The keys of ``rows`` that matrix.yaml does not expand to, on any device, at the row's own layout."""
    cases = {c.id: c for c in matrix.cases}
    known = {
        cell.key
        for layout in set(rows.values())
        for case in cases.values()
        for device in ("cpu", "cuda")
        for cell in expand_case(case, device, world_size=layout[0], nodes=layout[1])
    }
    return sorted(row.key for row in rows if row.key not in known)


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
    # a source build shows its commit next to the version: peft 0.18.0.dev0 @ 04d41cb
    versions = {k: shown(v, newest.sources.get(k)) for k, v in newest.versions.items()}
    return Column(cid, number, label, versions, len(distinct) > 1, dict(newest.sources))


def _row_order(matrix: Optional[Matrix], rows: set):
    if matrix is None:
        return lambda row: (row.case, _natural(row.cell))
    case_pos = {c.id: i for i, c in enumerate(matrix.cases)}
    cell_pos: Dict[str, int] = {}
    for case in matrix.cases:
        for ws, nodes in sorted({layout for row, layout in rows if row.case == case.id}):
            for i, cell in enumerate(expand_case(case, world_size=ws, nodes=nodes)):
                cell_pos.setdefault(cell.key, i)
    return lambda row: (case_pos.get(row.case, len(case_pos)), row.case, cell_pos.get(row.key, len(cell_pos)), row.cell)


def load_grid(results: Path, matrix: Optional[Matrix] = None) -> Grid:
    """The grid of every cells.jsonl under ``results`` (or of that one file); lines that are not records are left
    out and listed in ``Grid.skipped``. Raises OSError on a path that cannot be read."""
    results = Path(results)
    if not results.exists():
        raise FileNotFoundError(f"{results}: no such file or directory")
    skipped: List[Skipped] = []
    records = list(iter_records(results, skipped))
    return build_grid(records, matrix, str(results), skipped)
