"""The HUD page over three fake nights: since when each red cell is red, flaky marks, what a bisect named, filters."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Dict, List

from fsdp_matrix.history import cli
from tests.history.nights import NIGHTS, nightly_json, write_night


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
    for control in ('id="f-case"', 'id="f-combo"', 'id="f-red"', 'id="f-flaky"'):
        assert control in page
