"""The history DB: one row per cell per night, with its versions, sources, signature and confirmation; never twice."""

from __future__ import annotations

import json
import sqlite3

from fsdp_matrix.history import cli
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
    assert "night 2026-11-24 is in the DB already" in err and "runs are night 2026-11-24's already" in err
    assert sqlite3.connect(db).execute("SELECT count(*) FROM cells").fetchone() == (4,)


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    assert cli.main(["add", str(tmp_path / "empty"), "--db", str(tmp_path / "h.db")]) == 2
    (tmp_path / "not.db").write_text("not sqlite " * 100)
    assert cli.main(["add", str(write_night(tmp_path, 0)), "--db", str(tmp_path / "not.db")]) == 2
    assert cli.main(["hud", "--db", str(tmp_path / "missing.db")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("history ") for line in lines)
