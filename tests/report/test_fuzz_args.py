"""Hypothesis over the arguments of ``report`` and ``diff``: malformed argument lists, paths and
files give one line, a non-zero exit and no traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsdp_matrix.records import append
from tests.argfuzz import FUZZ, assert_one_line_error, tokens, tried, words
from tests.report.samples import make_record


@pytest.fixture
def inputs(tmp_path: Path) -> dict:
    good = tmp_path / "good"
    append(good / "cur", make_record("a-ws2", "fix-holds"))
    (tmp_path / "afile").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "cells.jsonl").write_text('{"case": "x", "cell"\n')
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "other.json").write_text(json.dumps({"schema": 99, "entries": {}}))
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "nul.jsonl").write_bytes(b"\x00\xff\xfe garbage\n")
    bad = ["afile", "empty", "torn", "bad.json", "other.json", "list.json", "nul.jsonl"]
    return {"good": str(good), "tmp": tmp_path, "bad": [str(tmp_path / b) for b in bad]}


def _bad_path(inputs: dict) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(inputs["bad"]), words.map(lambda t: str(inputs["tmp"] / ("m" + t))))


@pytest.mark.timeout(600)
def test_diff_malformed_arguments_give_one_line(inputs) -> None:
    good = inputs["good"]
    cases = st.one_of(
        st.tuples(_bad_path(inputs), st.booleans()).map(lambda p: [p[0], good] if p[1] else [good, p[0]]),
        st.lists(st.just(good), max_size=1),
        words.map(lambda t: [good, good, "--" + t.replace("=", "") + "-bogus"]),
        tokens.filter(lambda t: not t.startswith("-")).map(lambda t: [good, good, t]),
    )

    @FUZZ
    @given(argv=cases)
    def check(argv: List[str]) -> None:
        assert_one_line_error(["diff", *argv])

    check()
    tried("diff")


@pytest.mark.timeout(600)
def test_report_malformed_arguments_give_one_line(inputs) -> None:
    good = inputs["good"]
    afile = str(inputs["tmp"] / "afile")
    cases = st.one_of(
        _bad_path(inputs).map(lambda p: [p]),
        st.just([]),
        tokens.filter(lambda t: t not in ("text", "md", "html", "json", "junit")).map(lambda t: [good, "--format", t]),
        st.sampled_from([afile, afile + "/sub"]).map(lambda out: [good, "--out", out]),
        words.map(lambda t: [good, "--" + t.replace("=", "") + "-bogus"]),
        st.sampled_from(inputs["bad"]).map(lambda m: [good, "--matrix", m]),
    )

    @FUZZ
    @given(argv=cases)
    def check(argv: List[str]) -> None:
        assert_one_line_error(["report", *argv])

    check()
    tried("report")
