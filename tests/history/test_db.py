"""The history DB: one row per cell per night, with its versions, sources, signature and confirmation; never twice."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from typing import List, Tuple

import pytest

from fsdp_matrix.history import cli
from fsdp_matrix.history import db as history_db
from tests.history.nights import NIGHTS, nightly_json, write_night


def test_three_nights_one_row_per_cell_per_night(tmp_path) -> None:
    db = tmp_path / "history.db"
    for n, night in enumerate(NIGHTS):
        extra = ["--nightly", str(nightly_json(tmp_path / "n.json"))] if n == 1 else []
        assert cli.main(["add", str(write_night(tmp_path, n)), "--db", str(db), "--night", night, *extra]) == 0
    con = sqlite3.connect(db)
    assert con.execute("SELECT count(*) FROM cells").fetchone() == (12,)
    assert [n for (n,) in con.execute("SELECT night FROM nights ORDER BY ran_at")] == list(NIGHTS)
    row = con.execute(
        "SELECT verdict, confirmation, reruns, signature, duration_s FROM cells WHERE night=? AND cell=?",
        (NIGHTS[1], "flaky-ws2"),
    ).fetchone()
    assert row[:3] == ("crash", "flaky", json.dumps(["fix-holds", "fix-holds"])) and row[4] == 1.5
    sig = con.execute("SELECT signature FROM cells WHERE night=? AND cell='broken-ws2'", (NIGHTS[1],)).fetchone()
    assert sig == ("ValueError: boom",)
    versions = json.loads(
        con.execute("SELECT versions FROM combos WHERE night=? AND combo='newest'", (NIGHTS[1],)).fetchone()[0]
    )
    assert versions["peft"] == "0.22.1"
    culprits = con.execute("SELECT combo, cell, package, kind, changed, pr FROM culprits ORDER BY combo").fetchall()
    assert culprits == [
        ("main", "lora/late-ws2", "peft", "commit", "c" * 40, 3001),
        ("newest", "dora/broken-ws2", "peft", "release", "0.22.1", None),
    ]


def test_a_night_is_never_written_twice(tmp_path, capsys) -> None:
    db = tmp_path / "history.db"
    night = write_night(tmp_path, 0)
    assert cli.main(["add", str(night), "--db", str(db)]) == 0
    # the same name, or the same runs under another name: not written again, said so
    assert cli.main(["add", str(night), "--db", str(db)]) == 0
    assert cli.main(["add", str(night), "--db", str(db), "--night", "again"]) == 0
    err = capsys.readouterr().err
    assert "night 2026-11-24-run-0 is in the DB already" in err and "runs are night 2026-11-24-run-0's already" in err
    assert sqlite3.connect(db).execute("SELECT count(*) FROM cells").fetchone() == (4,)


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    assert cli.main(["add", str(tmp_path / "empty"), "--db", str(tmp_path / "h.db")]) == 2
    (tmp_path / "not.db").write_text("not sqlite " * 100)
    assert cli.main(["add", str(write_night(tmp_path, 0)), "--db", str(tmp_path / "not.db")]) == 2
    assert cli.main(["hud", "--db", str(tmp_path / "missing.db")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("history ") for line in lines)


def _nights(db) -> List[Tuple[str, str]]:
    return sqlite3.connect(db).execute("SELECT night, run_ids FROM nights ORDER BY night").fetchall()


def test_defect12_a_second_run_of_the_same_day_is_written_not_dropped(tmp_path, capsys) -> None:
    """Without --night the id was the UTC date alone: another run of the same day (other cells, other run ids) was
    'in the DB already: not written again', exit 0, and missing from the HUD."""
    db = tmp_path / "history.db"
    first, second = write_night(tmp_path, 0), write_night(tmp_path, 0, run="rerun")
    assert cli.main(["add", str(first), "--db", str(db)]) == 0
    assert cli.main(["add", str(second), "--db", str(db)]) == 0
    assert len(_nights(db)) == 2, capsys.readouterr().err
    assert [n for n, _ in _nights(db)] == [f"{NIGHTS[0]}-rerun", f"{NIGHTS[0]}-run-0"]
    # the same runs again: already written, exit 0, said so
    assert cli.main(["add", str(second), "--db", str(db)]) == 0
    assert "in the DB already" in capsys.readouterr().err and len(_nights(db)) == 2


def test_defect12_an_explicit_night_id_held_by_other_runs_is_refused(tmp_path, capsys) -> None:
    db = tmp_path / "history.db"
    assert cli.main(["add", str(write_night(tmp_path, 0)), "--db", str(db), "--night", "n1"]) == 0
    capsys.readouterr()
    assert cli.main(["add", str(write_night(tmp_path, 0, run="other")), "--db", str(db), "--night", "n1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "n1" in err[0] and "other runs" in err[0], err
    assert _nights(db) == [("n1", '["run-0"]')]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("history add: "), err
    return err[0]


def test_defect11_a_read_only_db_is_one_line_exit_2(tmp_path, monkeypatch, capsys) -> None:
    """An immutable DB file ended in 'sqlite3.OperationalError: attempt to write a readonly database', rc 1. (Opened
    read-only through SQLite's URI, since a test running as root writes through file modes.)"""
    db = tmp_path / "history.db"
    assert cli.main(["add", str(write_night(tmp_path, 0)), "--db", str(db)]) == 0
    capsys.readouterr()
    real = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda path, **kw: real(f"file:{path}?mode=ro", uri=True, **kw))
    assert cli.main(["add", str(write_night(tmp_path, 1)), "--db", str(db)]) == 2
    assert "read-only" in _one_line(capsys)


@pytest.mark.parametrize("lock", ["IMMEDIATE", "EXCLUSIVE"])
def test_defect11_a_busy_db_is_one_line_saying_busy(tmp_path, monkeypatch, capsys, lock) -> None:
    """Another connection's write transaction: 'database is locked' traceback after 5 s (IMMEDIATE), or 'not a usable
    history DB: database is locked' (EXCLUSIVE: the file is fine, it is busy)."""
    db = tmp_path / "history.db"
    assert cli.main(["add", str(write_night(tmp_path, 0)), "--db", str(db)]) == 0
    capsys.readouterr()
    monkeypatch.setattr(history_db, "BUSY_TIMEOUT_S", 0.2, raising=False)
    other = sqlite3.connect(db, isolation_level=None)
    other.execute(f"BEGIN {lock}")
    try:
        assert cli.main(["add", str(write_night(tmp_path, 1)), "--db", str(db)]) == 2
    finally:
        other.rollback()
    line = _one_line(capsys)
    assert "busy: another writer holds the DB; try again" in line and "not a usable" not in line


def test_defect11_two_writers_of_one_night_one_writes_the_other_is_told(tmp_path, monkeypatch, capsys) -> None:
    """The check ran outside the write transaction: with the window widened (as the review did, 0.5 s here), the
    second writer's insert ended in 'sqlite3.IntegrityError: UNIQUE constraint failed', rc 1."""
    db = tmp_path / "history.db"
    results = write_night(tmp_path, 0)
    real = history_db.already

    def slow(con, night):
        why = real(con, night)
        time.sleep(0.5)
        return why

    monkeypatch.setattr(history_db, "already", slow)
    codes, raised = [], []

    def add() -> None:
        try:
            codes.append(cli.main(["add", str(results), "--db", str(db), "--night", "same"]))
        except Exception as exc:  # what the test is about: no exception may escape
            raised.append(repr(exc))

    threads = [threading.Thread(target=add) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert raised == [] and codes == [0, 0]
    assert "night same is in the DB already" in capsys.readouterr().err
    assert _nights(db) == [("same", '["run-0"]')]
    assert sqlite3.connect(db).execute("SELECT count(*) FROM cells").fetchone() == (4,)
