"""The HTML page: hostile messages stay text, every entry has its details pane, nothing external is loaded."""

from __future__ import annotations

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
