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


def pane_blob(page: str) -> dict:
    """The pane data the page's script draws from (report/panes.py)."""
    from fsdp_matrix.report.panes import read_data

    return read_data(page)


def test_html_escapes_hostile_messages_everywhere():
    page = render_html(build_grid(sample_records(), parse_matrix(MATRIX)))
    # two scripts, both ours: the pane data (gzipped JSON in base64) and the code that draws a pane from it
    assert page.count("<script") == 2 and "<script>alert" not in page and "<b>bold" not in page
    parser = _Collect()
    parser.feed(page)
    assert parser.tags.count("script") == 2 and "b" in parser.tags  # our own <b> only
    assert parser.tags.count("b") == page.count("<b>")
    # the message survives exactly as the rank raised it: as text in the attention list, and in the pane data
    assert any(HOSTILE in t for t in parser.texts)
    blob = pane_blob(page)
    assert HOSTILE in blob["t"].values() and any(HOSTILE in s for s in blob["s"])
    assert not re.search(r"https?://", page)  # self-contained: no external asset


def test_html_links_every_entry_to_a_details_pane():
    page = render_html(build_grid(sample_records(), parse_matrix(MATRIX)))
    links = set(re.findall(r'href="#(e-\d+)"', page))
    blob = pane_blob(page)
    assert links == {f"e-{n + 1}" for n in range(len(blob["e"]))} and len(links) == 5
    assert any("Traceback (most recent call last)" in t for t in blob["t"].values())
    assert '<section class="pane" id="pane" hidden></section>' in page


def test_each_distinct_traceback_is_stored_once_across_combos():
    """The same failure in two combos' envs (their site-packages paths differ) is one stored traceback."""
    import dataclasses

    from fsdp_matrix.records import RankResult

    def in_env(rec, env):
        frame = f'  File "/work/.nox/{env}/lib/python3.11/site-packages/torch/fsdp.py", line 9, in wrap\n'
        tb = "Traceback (most recent call last):\n" + frame + "ValueError: uniform dtype\n"
        ranks = [RankResult(rank=r, status="error", error_type="ValueError", traceback=tb) for r in (0, 1)]
        return dataclasses.replace(rec, observed=dataclasses.replace(rec.observed, ranks=ranks))

    recs = sample_records()
    page = render_html(build_grid([in_env(recs[1], "matrix-old"), in_env(recs[4], "matrix-new")], parse_matrix(MATRIX)))
    blob = pane_blob(page)
    tracebacks = [t for t in blob["t"].values() if t.startswith("Traceback")]
    assert tracebacks == ['Traceback (most recent call last):\n  File "site-packages/torch/fsdp.py", line 9, in wrap\n'
                          "ValueError: uniform dtype\n"]  # fmt: skip
    # four ranks point at it
    assert sum(1 for e in blob["e"] for r in e[4] if r[2]) == 4


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

    assert "<script>alert" not in crafted_page(tmp_path, main)


def test_rank_fields_of_a_record_in_memory_are_escaped():
    """Past the reader: a record built in memory (no validation) with markup in every rank field."""
    from fsdp_matrix.records import RankResult

    rec = sample_records()[1]
    rec.observed.ranks = [
        RankResult(rank=CRAFTED_RANK, status=CRAFTED_RANK, signal=CRAFTED_RANK, error_type=CRAFTED_RANK, exit_code=-9)
    ]
    page = render_html(build_grid([rec], parse_matrix(MATRIX)))
    # only data in the pane blob, which the script puts in the page as text
    assert "<script>alert" not in page
    assert any(CRAFTED_RANK in s for s in pane_blob(page)["s"])


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
    blob = pane_blob(page)
    assert sum(1 for e in blob["e"] for _, value in e[2] if "at unknown time" in blob["s"][value]) == 3
    json.loads((tmp_path / "out" / "report.json").read_text(), parse_constant=lambda c: 1 / 0)  # strict JSON


def test_a_platform_skip_names_its_platform_rule_not_a_case_rule():
    import dataclasses

    from fsdp_matrix.report.panes import expected_text as _expected_text

    expected = {"kind": "skip", "reason": "no FSDP2 here", "source": "observed", "platform": "fsdp2-no-cpu"}
    rec = dataclasses.replace(sample_records()[0], expected=expected)
    text = _expected_text(rec)
    assert "[platform fsdp2-no-cpu: observed]" in text and "rule None" not in text


def test_the_pane_data_is_packed_and_the_same_records_give_the_same_page():
    grid = build_grid(sample_records(), parse_matrix(MATRIX))
    strip = lambda page: re.sub(r"generated [^<&]*", "", page)  # noqa: E731
    assert strip(render_html(grid)) == strip(render_html(grid))
    page = render_html(grid)
    packed = re.search(r'<script type="application/gzip\+base64" id="report-data">([^<]*)</script>', page)
    assert packed and re.fullmatch(r"[A-Za-z0-9+/=]+", packed.group(1))


def test_a_matrix_sized_report_stays_small():
    """13 combos x 300 cells, every failing cell with its own two ranks' tracebacks, 30 signatures repeated across
    combos (paths differ per env), as a full CPU matrix has them: the page stays under 2 MB (one static pane per
    entry made 17.5 MB of the real one)."""
    import dataclasses

    from fsdp_matrix.records import RankResult
    from tests.report.samples import make_record

    frames = "".join(
        f'  File "/x/.nox/matrix-{{env}}/lib/site-packages/torch/m{n}.py", line {n}, in f\n' for n in range(40)
    )
    records = []
    for combo in range(13):
        for cell in range(300):
            rec = make_record(f"c{cell}-ws2", "reproduced" if cell % 2 else "fix-holds", f"k{combo}", f"case{cell % 7}")
            if cell % 2:
                tb = (
                    "Traceback (most recent call last):\n"
                    + frames.format(env=combo)
                    + f"ValueError: sig {cell // 2 % 30}\n"
                )
                ranks = [RankResult(rank=r, status="error", error_type="ValueError", traceback=tb) for r in (0, 1)]
                rec = dataclasses.replace(rec, observed=dataclasses.replace(rec.observed, ranks=ranks))
            records.append(rec)
    page = render_html(build_grid(records))
    assert len(pane_blob(page)["e"]) == 3900 and len(pane_blob(page)["t"]) == 30 + 1  # + the sample's message
    assert len(page.encode()) < 2_000_000
