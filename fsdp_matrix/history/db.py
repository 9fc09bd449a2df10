"""The history of nights: one SQLite file, one row per cell per night, kept between nights.

Tables (``sqlite3 FILE .schema`` shows them; ``datasette FILE`` browses and queries them, optionally):

- ``nights``: one row per night added: its id, when it ran, the results it came from, its run ids;
- ``combos``: per night and combo, the versions and the sources (commits) it ran with;
- ``cells``: per night, combo and cell, the verdict, the error type and signature, the duration, and the
  confirmation of a flip (confirmed, flaky...; NULL when the cell did not flip or was not rerun);
- ``culprits``: per night, combo and cell, what a bisect named: the first changed release, or the first changed
  commit and its PR (from ``nightly --json``).

A night is written once: adding a night id the file already has from the same runs, or records whose run ids another
night already holds, writes nothing and says so; a night id the file has from other runs is refused (``--night``
names another night). Without ``--night`` the id is the UTC date plus the records' run ids, so that two runs of one
day are two nights.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from fsdp_matrix.bisect.outcome import normalise_message
from fsdp_matrix.records import Record
from fsdp_matrix.report.grid import LOCAL

SCHEMA = """
CREATE TABLE IF NOT EXISTS nights (
  night TEXT PRIMARY KEY, ran_at REAL, added_at REAL, source TEXT, run_ids TEXT
);
CREATE TABLE IF NOT EXISTS combos (
  night TEXT NOT NULL REFERENCES nights(night), combo TEXT NOT NULL, versions TEXT, sources TEXT,
  PRIMARY KEY (night, combo)
);
CREATE TABLE IF NOT EXISTS cells (
  night TEXT NOT NULL REFERENCES nights(night), combo TEXT NOT NULL, case_id TEXT NOT NULL, cell TEXT NOT NULL,
  verdict TEXT NOT NULL, error_type TEXT, signature TEXT, duration_s REAL, confirmation TEXT, reruns TEXT,
  finished_at REAL, PRIMARY KEY (night, combo, case_id, cell)
);
CREATE TABLE IF NOT EXISTS culprits (
  night TEXT NOT NULL REFERENCES nights(night), combo TEXT NOT NULL, cell TEXT NOT NULL, package TEXT NOT NULL,
  kind TEXT NOT NULL, changed TEXT NOT NULL, subject TEXT, pr INTEGER, PRIMARY KEY (night, combo, cell, package)
);
CREATE INDEX IF NOT EXISTS cells_by_cell ON cells (combo, case_id, cell, night);
"""


class HistoryError(Exception):
    """The DB or the night cannot be used as asked (one line)."""


@dataclass(frozen=True)
class Culprit:
    """What a bisect named for one cell of one night."""

    combo: str
    """Combo column id."""
    cell: str
    """``case/cell``."""
    package: str
    """The package whose release or commit changed the cell."""
    kind: str
    """``release`` (the upgrade check) or ``commit`` (the commit bisect)."""
    changed: str
    """The first changed release (``0.22.1``) or commit sha."""
    subject: Optional[str] = None
    """The commit's subject line (commits only)."""
    pr: Optional[int] = None
    """The PR the commit came from, when its subject or merge names one."""


@dataclass
class Night:
    """One night's records, ready to be added."""

    night: str
    """Its id (the nightly run, or the date it ran)."""
    records: List[Record]
    """The newest record of every cell of every combo."""
    source: str = ""
    """Where the records were read from."""
    culprits: List[Culprit] = field(default_factory=list)
    """What the night's bisects named."""

    @property
    def ran_at(self) -> float:
        return min((r.finished_at for r in self.records), default=time.time())

    @property
    def run_ids(self) -> List[str]:
        """The run ids its records carry, sorted (none for records older than run ids)."""
        return sorted({r.run_id for r in self.records if r.run_id})

    def default_id(self) -> str:
        """The UTC date its first record was written, plus its run ids (a digest of them past ``SHOWN_RUNS``)."""
        date = dt.datetime.fromtimestamp(self.ran_at, dt.timezone.utc).strftime("%Y-%m-%d")
        runs = self.run_ids
        if len(runs) > SHOWN_RUNS:
            digest = hashlib.sha256("+".join(runs).encode()).hexdigest()[:12]
            return f"{date}-{digest}-{len(runs)}runs"
        return "-".join([date] + (["+".join(runs)] if runs else []))


SHOWN_RUNS = 3
"""A default night id names this many run ids at most; more (one run per combo) are named by a digest of them."""


BUSY_TIMEOUT_S = 60.0
"""How long a writer waits for another one to finish before giving up: a night's insert takes well under a second,
but two nightly workflows (or a rerun and its original) may add at the same moment; Python's 5 s default is short
on a loaded runner."""


def db_error(path: Path, exc: sqlite3.Error) -> HistoryError:
    """One line for an ``sqlite3.Error`` on the DB at ``path``: busy, read-only, or not a usable DB."""
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
        return HistoryError(f"{path}: busy: another writer holds the DB; try again ({text} after {BUSY_TIMEOUT_S:g}s)")
    if "readonly" in text or "read-only" in text:
        return HistoryError(f"{path}: the DB is read-only here, nothing written: {text}")
    return HistoryError(f"{path}: not a usable history DB: {text}")


def connect(path: Path) -> sqlite3.Connection:
    """The DB at ``path`` (created with its tables when new), in autocommit mode: writers open their transaction
    themselves (``add_night``)."""
    try:
        db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        db.executescript(SCHEMA)
    except sqlite3.Error as exc:
        raise db_error(path, exc) from None
    return db


def signature(rec: Record) -> Optional[str]:
    """The error as two nights can compare it: its type, and its message without paths, addresses and numbers."""
    obs = rec.observed
    if not (obs.error_type or obs.error_message):
        return None
    return f"{obs.error_type or '?'}: {normalise_message(obs.error_message)}".strip()


def _cell_row(night: str, rec: Record) -> Tuple[Any, ...]:
    conf = rec.confirmation
    reruns = json.dumps(conf.reruns + conf.at_previous) if conf else None
    return (
        night, rec.combo or LOCAL, rec.case, rec.cell, rec.verdict, rec.observed.error_type, signature(rec),
        rec.duration_s, conf.status if conf else None, reruns, rec.finished_at,
    )  # fmt: skip


def _combo_rows(night: str, records: Iterable[Record]) -> List[Tuple[str, str, str, str]]:
    newest: Dict[str, Record] = {}
    for rec in records:
        column = rec.combo or LOCAL
        if column not in newest or rec.finished_at >= newest[column].finished_at:
            newest[column] = rec
    return [
        (night, c, json.dumps(r.versions, sort_keys=True), json.dumps(r.sources, sort_keys=True))
        for c, r in newest.items()
    ]


def already(db: sqlite3.Connection, night: Night) -> Optional[str]:
    """Why ``night`` must not be written (it is in the DB already), or None."""
    held = db.execute("SELECT run_ids FROM nights WHERE night = ?", (night.night,)).fetchone()
    runs = set(night.run_ids)
    if held and set(json.loads(held[0] or "[]")) != runs:
        others = ", ".join(json.loads(held[0] or "[]")) or "none recorded"
        raise HistoryError(
            f"night {night.night} is in the DB already, from other runs ({others}): not written; give another --night"
        )
    if held:
        return f"night {night.night} is in the DB already"
    for other, held in db.execute("SELECT night, run_ids FROM nights"):
        if runs & set(json.loads(held or "[]")):
            return f"its records' runs are night {other}'s already"
    return None


def _insert(db: sqlite3.Connection, night: Night) -> None:
    db.execute(
        "INSERT INTO nights VALUES (?, ?, ?, ?, ?)",
        (night.night, night.ran_at, time.time(), night.source, json.dumps(night.run_ids)),
    )
    db.executemany("INSERT INTO combos VALUES (?, ?, ?, ?)", _combo_rows(night.night, night.records))
    db.executemany(
        "INSERT INTO cells VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [_cell_row(night.night, r) for r in night.records],
    )
    db.executemany(
        "INSERT OR REPLACE INTO culprits VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(night.night, c.combo, c.cell, c.package, c.kind, c.changed, c.subject, c.pr) for c in night.culprits],
    )


def add_night(path: Path, night: Night) -> Optional[str]:
    """Write ``night`` into the DB at ``path``; the reason it was not written, or None. The check and the insert are
    one ``BEGIN IMMEDIATE`` transaction: a second writer of the same night waits for the first (up to
    ``BUSY_TIMEOUT_S``), then is told the night is in the DB already."""
    with closing(connect(path)) as db:
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                why = already(db, night)
                if why is None:
                    _insert(db, night)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("ROLLBACK" if why else "COMMIT")
        except sqlite3.Error as exc:
            raise db_error(path, exc) from None
    return why


def culprits_from_nightly(data: Dict[str, Any]) -> List[Culprit]:
    """What ``nightly --json`` says its upgrade checks and commit bisects named."""
    out = []
    for entry in data.get("upgrades") or []:
        column = entry.get("column", "")
        for changed in (entry.get("result") or {}).get("changed") or []:
            for package, release in (changed.get("first_changed") or {}).items():
                out.append(Culprit(column, changed["cell"], package, "release", str(release)))
        bisect = entry.get("commit_bisect") or {}
        for cell, answer in (bisect.get("cells") or {}).items():
            commit = (answer or {}).get("commit") or {}
            if commit.get("sha"):
                pr = commit.get("pr")
                out.append(
                    Culprit(column, cell, entry.get("package", "?"), "commit", commit["sha"], commit.get("subject"), pr)
                )
    return out
