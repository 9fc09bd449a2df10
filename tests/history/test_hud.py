"""The HUD page over three fake nights: since when each red cell is red, flaky marks, what a bisect named, filters."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Dict, List, Tuple

import pytest

from fsdp_matrix.history import cli
from tests.history.nights import LATER, NIGHTS, PLAN, nightly_json, write_night


class Rows(HTMLParser):
    """Each table row with data-combo: its attributes, and the class and text of each of its cells."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: List[Dict] = []
        self.scripts = 0
        self._cell = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            self.scripts += 1
        if tag == "tr" and "data-combo" in attrs:
            self.rows.append({"attrs": attrs, "cells": []})
        elif tag in ("td", "th") and self.rows and "data-combo" in self.rows[-1]["attrs"]:
            self._cell = {"class": attrs.get("class", ""), "title": attrs.get("title", ""), "text": ""}
            self.rows[-1]["cells"].append(self._cell)

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data


def hud(tmp_path, nights: int = 14) -> Rows:
    db = tmp_path / "history.db"
    for n, night in enumerate(NIGHTS):
        extra = ["--nightly", str(nightly_json(tmp_path / "n.json"))] if n == 1 else []
        assert cli.main(["add", str(write_night(tmp_path, n)), "--db", str(db), "--night", night, *extra]) == 0
    assert cli.main(["hud", "--db", str(db), "-o", str(tmp_path / "hud.html"), "--nights", str(nights)]) == 0
    page = (tmp_path / "hud.html").read_text()
    assert "http://" not in page and "https://" not in page, "no external asset: it works opened from disk"
    parsed = Rows()
    parsed.feed(page)
    return parsed


def by_cell(rows: Rows) -> Dict[str, Dict]:
    return {r["cells"][0]["text"]: r for r in rows.rows}


def test_the_hud_shows_since_when_red_flaky_marks_and_what_the_bisect_named(tmp_path) -> None:
    rows = by_cell(hud(tmp_path))
    assert set(rows) == {"dora/broken-ws2", "dora/flaky-ws2", "lora/steady-ws2", "lora/late-ws2"}
    # columns: cell, three nights, red since, first changed
    broken = [c["text"] for c in rows["dora/broken-ws2"]["cells"]]
    assert broken == ["dora/broken-ws2", "F", "!R", "!R", NIGHTS[1], "peft 0.22.1"]
    assert rows["dora/broken-ws2"]["attrs"]["data-red"] == "1"
    late = [c["text"] for c in rows["lora/late-ws2"]["cells"]]
    assert late[1:5] == ["F", "F", "!D", NIGHTS[2]]
    assert late[5] == f"peft {'c' * 10} Refactor wrap (#3001)"
    # the flaky night is marked, and the cell is not red
    flaky = rows["dora/flaky-ws2"]
    night2 = flaky["cells"][2]
    assert "flaky" in night2["class"] and night2["text"] == "!C~" and "(flaky)" in night2["title"]
    assert flaky["attrs"]["data-flaky"] == "1" and flaky["attrs"]["data-red"] == "0" and flaky["cells"][4]["text"] == ""
    steady = rows["lora/steady-ws2"]
    assert [c["text"] for c in steady["cells"][1:5]] == ["R", "R", "R", ""]
    assert {r["attrs"]["data-combo"] for r in rows.values()} == {"newest", "main"}


def test_the_last_n_nights_are_the_columns_and_since_when_still_counts_every_night(tmp_path) -> None:
    rows = by_cell(hud(tmp_path, nights=1))
    broken = [c["text"] for c in rows["dora/broken-ws2"]["cells"]]
    assert broken == ["dora/broken-ws2", "!R", NIGHTS[1], "peft 0.22.1"]


def test_the_filters_are_one_inline_script(tmp_path) -> None:
    page_rows = hud(tmp_path)
    assert page_rows.scripts == 1
    page = (tmp_path / "hud.html").read_text()
    for control in ('id="f-case"', 'id="f-combo"', 'id="f-red"', 'id="f-flaky"', 'id="f-alert"'):
        assert control in page


def _add(tmp_path, nights) -> None:
    """Add each results dir of ``nights`` (night id -> dir), in order, into ``tmp_path/history.db``."""
    for night, results in nights.items():
        assert cli.main(["add", str(results), "--db", str(tmp_path / "history.db"), "--night", night]) == 0


def _page(tmp_path, shown: int, capsys) -> Tuple[str, str, Dict[str, Dict]]:
    """The HUD of the last ``shown`` nights: the CLI's summary line, the page, its rows by cell."""
    out = tmp_path / f"hud{shown}.html"
    capsys.readouterr()
    assert cli.main(["hud", "--db", str(tmp_path / "history.db"), "-o", str(out), "--nights", str(shown)]) == 0
    parsed = Rows()
    parsed.feed(out.read_text())
    return capsys.readouterr().out, out.read_text(), by_cell(parsed)


def _title(page: str) -> str:
    return page.split("<title>", 1)[1].split("</title>", 1)[0]


def test_defect13_a_combo_silent_on_the_newest_night_is_no_red_now_and_is_flagged(tmp_path, capsys) -> None:
    """main's job dies on the fourth night: its cell red on the third is not "red on the last night"; the combo is
    counted and shown as silent since the third night, in the page, its title and the summary line."""
    _add(tmp_path, {night: write_night(tmp_path, n) for n, night in enumerate(NIGHTS)})
    _add(tmp_path, {LATER: write_night(tmp_path, 3, only={"newest"})})
    for shown in (14, 1):  # with one night shown, main has no row at all: still said
        line, page, rows = _page(tmp_path, shown, capsys)
        assert " 1 red" in line and "1 combo silent" in line, line
        assert "1 red" in _title(page) and "1 combo silent" in _title(page), _title(page)
        assert f"main: no record since {NIGHTS[2]}" in page
    _, _, rows = _page(tmp_path, 14, capsys)
    late = rows["lora/late-ws2"]
    assert late["attrs"]["data-red"] == "0" and late["attrs"]["data-alert"] == "1"
    assert [c["text"] for c in late["cells"]][3:6] == ["!D", ".", f"no record since {NIGHTS[2]}"]
    assert rows["dora/broken-ws2"]["attrs"]["data-red"] == "1"


def test_a_verdict_that_becomes_skipped_is_an_alert_on_the_hud(tmp_path, capsys) -> None:
    plan = dict(PLAN)
    plan[("newest", "lora", "steady-ws2")] = ["reproduced", "reproduced", "reproduced", "skipped"]
    _add(tmp_path, {night: write_night(tmp_path, n, plan=plan) for n, night in enumerate(NIGHTS + (LATER,))})
    for shown in (14, 1):  # the verdict it had before is read even when its night is not shown
        line, page, rows = _page(tmp_path, shown, capsys)
        assert "1 newly skipped" in line and "1 newly skipped" in _title(page)
        steady = rows["lora/steady-ws2"]
        assert steady["attrs"]["data-alert"] == "1" and steady["attrs"]["data-red"] == "0"
        assert steady["cells"][-2]["text"] == "skipped (was reproduced)"


class CountingDB:
    """A connection that counts the rows its queries of the ``cells`` table hand back."""

    def __init__(self, con) -> None:
        self.con, self.rows, self.queries = con, 0, 0

    def execute(self, sql: str, *args):
        cursor = self.con.execute(sql, *args)
        if "cells" not in sql:
            return cursor
        self.queries += 1
        return self._counted(cursor)

    def _counted(self, cursor):
        """The rows as the caller takes them (SQLite hands a cursor's rows over one at a time)."""
        for row in cursor:
            self.rows += 1
            yield row

    def __getattr__(self, name: str):
        return getattr(self.con, name)


GREEN = [("main", "lora", f"green{i}-ws2") for i in range(8)]
"""Eight cells that pass every night."""


def test_the_hud_reads_only_the_nights_it_shows_plus_each_red_cells_streak(tmp_path, monkeypatch, capsys) -> None:
    """load_hud read every row of ``cells`` (100 nights x 4,000 cells: 6.6 s, 185 MB; 400 nights: 28 s, 596 MB).
    30 nights of 9 cells, one red since night 25, 3 nights shown: the rows read are the 27 shown, plus the red
    cell's streak back to its last green night (at most 7 more), not all 270."""
    plan = {key: ["fix-holds"] for key in GREEN}
    plan[("main", "dora", "red-ws2")] = ["fix-holds"] * 25 + ["REGRESSION"]
    for n in range(30):
        results = write_night(tmp_path, n, plan=plan)
        assert cli.main(["add", str(results), "--db", str(tmp_path / "history.db"), "--night", f"n{n:02d}"]) == 0
    from fsdp_matrix.history import hud as hud_module

    opened: List[CountingDB] = []
    real = hud_module.connect
    monkeypatch.setattr(hud_module, "connect", lambda path: opened.append(CountingDB(real(path))) or opened[-1])
    line, page, rows = _page(tmp_path, 3, capsys)
    assert rows["dora/red-ws2"]["cells"][-2]["text"] == "n25" and " 1 red" in line
    assert len(rows) == 9 and sum(db.rows for db in opened) <= 27 + 7, [(db.rows, db.queries) for db in opened]


@pytest.mark.parametrize("nights", ["0", "-1", "100000"])
def test_nights_out_of_bounds_is_refused_in_one_line(tmp_path, capsys, nights) -> None:
    """--nights 0 or -1 silently showed every night (34 MB page at 100 nights)."""
    assert cli.main(["add", str(write_night(tmp_path, 0)), "--db", str(tmp_path / "h.db")]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["hud", "--db", str(tmp_path / "h.db"), "-o", str(tmp_path / "o.html"), "--nights", nights])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and "--nights" in err[0], err
    assert not (tmp_path / "o.html").exists()


def test_a_cell_silent_on_the_newest_night_is_counted_apart_from_its_combo(tmp_path, capsys) -> None:
    plan = dict(PLAN)
    plan[("newest", "dora", "broken-ws2")] = ["fix-holds", "REGRESSION", "REGRESSION", "-"]
    _add(tmp_path, {night: write_night(tmp_path, n, plan=plan) for n, night in enumerate(NIGHTS + (LATER,))})
    line, page, rows = _page(tmp_path, 14, capsys)
    assert "1 cell silent" in line and "combo" not in line.split(" -> ")[0].split("cells, ", 1)[1], line
    broken = rows["dora/broken-ws2"]
    assert broken["attrs"]["data-red"] == "0" and broken["cells"][-2]["text"] == f"no record since {NIGHTS[2]}"
