"""The HTML page: hostile messages stay text, every entry has its details pane, nothing external is loaded."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

from fsdp_matrix.matrix import parse_matrix
from fsdp_matrix.report.grid import build_grid
from fsdp_matrix.report.html import render_html
from tests.report.samples import HOSTILE, MATRIX, sample_records


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.texts, self.attrs = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [v for _, v in attrs if v]

    def handle_data(self, data):
        self.texts.append(data)


def test_html_escapes_hostile_messages_everywhere():
    page = render_html(build_grid(sample_records(), parse_matrix(MATRIX)))
    assert "<script" not in page and "<b>bold" not in page
    parser = _Collect()
    parser.feed(page)
    assert "script" not in parser.tags and "b" in parser.tags  # our own <b> only
    assert parser.tags.count("b") == page.count("<b>")
    # the message survives, as text and in the tooltip, exactly as the rank raised it
    assert any(HOSTILE in t for t in parser.texts)
    assert any(HOSTILE in a for a in parser.attrs)
    assert not re.search(r"https?://", page)  # self-contained: no external asset


def test_html_links_every_entry_to_a_details_pane():
    page = render_html(build_grid(sample_records(), parse_matrix(MATRIX)))
    links = set(re.findall(r'href="#(e-\d+)"', page))
    panes = set(re.findall(r'<section class="pane" id="(e-\d+)"', page))
    assert links == panes and len(panes) == 5
    assert "Traceback (most recent call last)" in page


CRAFTED_RANK = "<script>alert('rank')</script>"


def crafted_page(tmp_path, main) -> str:
    """A cells.jsonl line whose rank fields were crafted, through ``report``'s main; the page it wrote.

    Written against the command line so the same body runs on the pre-restructure commit 6b25d25 (whose modules
    had other names): only ``main`` differs.
    """
    record = {
        "case": "c",
        "cell": "x-ws2",
        "params": {},
        "versions": {},
        "device": "cpu",
        "world_size": 2,
        "expected": {"kind": "ok"},
        "verdict": "crash",
        "duration_s": 1.0,
        "finished_at": 1.0,
        "observed": {
            "status": "crash",
            "ranks": [{"rank": CRAFTED_RANK, "status": "crash", "exit_code": None, "signal": CRAFTED_RANK}],
        },
    }
    results = tmp_path / "results"
    results.mkdir()
    (results / "cells.jsonl").write_text(json.dumps(record) + "\n")
    main([str(results), "--format", "html"])
    page = results / "report.html"
    return page.read_text() if page.exists() else ""


def test_crafted_rank_field_never_reaches_the_page_as_markup(tmp_path):
    """The HTML report escaped the rank's status but wrote the rank number itself raw."""
    from fsdp_matrix.report.cli import main

    assert "<script" not in crafted_page(tmp_path, main)


def test_rank_fields_of_a_record_in_memory_are_escaped():
    """Past the reader: a record built in memory (no validation) with markup in every rank field."""
    from fsdp_matrix.records import RankResult

    rec = sample_records()[1]
    rec.observed.ranks = [
        RankResult(rank=CRAFTED_RANK, status=CRAFTED_RANK, signal=CRAFTED_RANK, error_type=CRAFTED_RANK, exit_code=-9)
    ]
    page = render_html(build_grid([rec], parse_matrix(MATRIX)))
    assert "<script" not in page and "&lt;script&gt;alert(&#x27;rank&#x27;)" in page


def test_defect15_a_record_with_a_nan_or_infinite_finished_at_is_reported(tmp_path, capsys):
    """``report`` on a record with ``finished_at: NaN`` ended in ``ValueError: Invalid value NaN``
    from time.localtime."""
    from fsdp_matrix.records import append
    from fsdp_matrix.report import cli as report_cli
    from tests.report.samples import make_record

    for n, when in enumerate((float("nan"), float("inf"), 1e300)):
        append(tmp_path / "res" / "cur", make_record(f"t{n}-ws2", "fix-holds", finished_at=when))
    assert report_cli.main([str(tmp_path / "res"), "--out", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.count("at unknown time") == 3
    json.loads((tmp_path / "out" / "report.json").read_text(), parse_constant=lambda c: 1 / 0)  # strict JSON


def test_a_platform_skip_names_its_platform_rule_not_a_case_rule():
    import dataclasses

    from fsdp_matrix.report.html import _expected_text

    expected = {"kind": "skip", "reason": "no FSDP2 here", "source": "observed", "platform": "fsdp2-no-cpu"}
    rec = dataclasses.replace(sample_records()[0], expected=expected)
    text = _expected_text(rec)
    assert "[platform fsdp2-no-cpu: observed]" in text and "rule None" not in text
