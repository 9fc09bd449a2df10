"""JUnit XML per combo: valid XML whatever the messages hold, with the right counts and tracebacks."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from fsdp_matrix.matrix import parse_matrix
from fsdp_matrix.report.grid import build_grid
from fsdp_matrix.report.junit import junit_xml
from tests.report.samples import MATRIX, sample_records


def test_junit_is_valid_xml_with_counts_and_tracebacks():
    grid = build_grid(sample_records(), parse_matrix(MATRIX))
    new, old = grid.columns
    root = ET.fromstring(junit_xml(grid, old))
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("2", "1", "0")
    failed = [tc for tc in suite.iter("testcase") if tc.find("failure") is not None]
    assert [tc.get("name") for tc in failed] == ["dora-ws2"]
    fail = failed[0].find("failure")
    assert fail.get("type") == "REGRESSION" and "<script>" in fail.get("message")
    assert "--- rank 1: error" in fail.text and "Traceback" in fail.text
    assert "\x1b" not in fail.text  # escape codes are not valid XML 1.0
    suite = ET.fromstring(junit_xml(grid, new)).find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    assert len(list(suite.iter("skipped"))) == 1
