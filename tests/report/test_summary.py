"""``summary``: two runs (records or pytest report-logs) into a step-summary markdown and a message of at most 2,900
characters naming the changed cells, regressions first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdp_matrix import cli
from fsdp_matrix.records import Record, append
from fsdp_matrix.report import summary
from fsdp_matrix.report.diff import Change
from fsdp_matrix.report.markdown import md_escape
from tests.report.samples import HOSTILE, make_record


def _results(tmp_path: Path, name: str, records: List[Record]) -> Path:
    root = tmp_path / name
    for rec in records:
        append(root / (rec.combo or ""), rec)
    return root


OLD = [
    make_record("a-ws2", "fix-holds"),
    make_record("b-ws2", "reproduced"),
    make_record("c-ws2", "REGRESSION"),
    make_record("d-ws2", "skipped"),
    make_record("e-ws2", "reproduced"),
]
NEW = [
    make_record("a-ws2", "REGRESSION"),  # a fix that stopped holding
    make_record("b-ws2", "reproduced"),  # unchanged
    make_record("c-ws2", "fix-holds"),  # fixed
    make_record("d-ws2", "reproduced"),  # now runs
    make_record("e-ws2", "UNEXPECTED-FIX"),  # upstream fixed it
]


def test_two_result_dirs_give_a_markdown_and_a_message_naming_the_changed_cells(tmp_path, capsys):
    old, new = _results(tmp_path, "old", OLD), _results(tmp_path, "new", NEW)
    md, msg = tmp_path / "summary.md", tmp_path / "message.txt"
    assert cli.main(["summary", str(old), str(new), "--markdown", str(md), "--message", str(msg)]) == 0
    text, message = md.read_text(), msg.read_text()
    assert "1 regressions, 2 fixes, 1 other changes (5 cells)" in text
    # regressions first, then fixes, then the rest; the unchanged cell nowhere
    assert text.index("### Regressions (1)") < text.index("### Fixes (2)") < text.index("### Other changes (1)")
    row = ["cur", "dora/a-ws2", "F fix-holds", "!R REGRESSION"]
    assert "| " + " | ".join(md_escape(c) for c in row) + " |" in text
    assert "dora/b-ws2" not in text and "dora/b-ws2" not in message
    assert len(message) <= summary.MESSAGE_LIMIT
    lines = message.splitlines()
    assert lines[0] == "fsdp-matrix: 1 regressions, 2 fixes, 1 other changes (5 cells)"
    assert lines[1:3] == ["Regressions:", "• [cur] dora/a-ws2: fix-holds → REGRESSION"]
    for cell in ("a-ws2", "c-ws2", "d-ws2", "e-ws2"):
        assert f"dora/{cell}" in message
    assert capsys.readouterr().out.strip() == message


def test_the_markdown_is_appended_and_escapes_what_a_record_says(tmp_path):
    old = _results(tmp_path, "old", [make_record("a-ws2", "fix-holds")])
    new = _results(tmp_path, "new", [make_record("a-ws2", "REGRESSION", message=HOSTILE)])
    md = tmp_path / "step-summary.md"
    md.write_text("earlier step\n")
    assert summary.main([str(old), str(new), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert text.startswith("earlier step\n## fsdp-matrix: what changed")
    # the record's text is escaped (pipes, HTML), never interpreted
    assert "<script>" not in text.replace("\\<", "") and md_escape(HOSTILE)[:40] in text


def test_no_change_says_so(tmp_path, capsys):
    old = _results(tmp_path, "old", OLD)
    assert summary.main([str(old), str(old)]) == 0
    assert capsys.readouterr().out.strip() == "fsdp-matrix: no verdict changed (5 cells)"


def test_unreadable_input_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"$report_type": "SessionStart"}\n')
    assert summary.main([str(bad), str(_results(tmp_path, "new", NEW))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("summary: ") and err.count("\n") == 1 and "no TestReport line" in err
    assert summary.main([str(tmp_path / "missing"), str(tmp_path / "missing")]) == 2


# ------------------------------------------------------------------------------------------- pytest report-logs


def _report(nodeid: str, when: str, outcome: str, props: Optional[Dict[str, Any]] = None, **more: Any) -> dict:
    return {
        "$report_type": "TestReport",
        "nodeid": nodeid,
        "when": when,
        "outcome": outcome,
        "user_properties": [[k, v] for k, v in (props or {}).items()],
        "longrepr": None,
        **more,
    }


def _test(nodeid: str, outcome: str, props: Optional[Dict[str, Any]] = None, **more: Any) -> List[dict]:
    """The three lines pytest-reportlog writes for one test (the properties ride on the call and teardown)."""
    return [
        _report(nodeid, "setup", "passed"),
        _report(nodeid, "call", outcome, props, **more),
        _report(nodeid, "teardown", "passed", props),
    ]


def _log(tmp_path: Path, name: str, tests: List[List[dict]], junk: str = "") -> Path:
    path = tmp_path / f"{name}.jsonl"
    lines = [{"pytest_version": "8.4.2", "$report_type": "SessionStart"}]
    lines += [line for test in tests for line in test]
    lines.append({"exitstatus": 1, "$report_type": "SessionFinish"})
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n" + junk)
    return path


CELL = "fsdp_matrix/suite/test_cells.py::test_cell[{}]"
VERSIONS = {"peft": "0.21.2", "torch": "2.13.0"}


def _props(verdict: str, versions: Optional[dict] = None) -> Dict[str, Any]:
    return {
        "verdict": verdict,
        "expected": "ok",
        "observed": "ValueError: boom" if verdict == "REGRESSION" else "ok",
        "versions": json.dumps(versions or VERSIONS),
    }


def test_report_logs_are_read_by_their_user_properties(tmp_path):
    old = _log(tmp_path, "old", [_test(CELL.format("dora/a-ws2"), "passed", _props("fix-holds"))])
    new_versions = {**VERSIONS, "peft": "0.22.0.dev0"}
    new = _log(
        tmp_path,
        "new",
        [_test(CELL.format("dora/a-ws2"), "failed", _props("REGRESSION", new_versions))],
        junk="not json\n",
    )
    md = tmp_path / "s.md"
    assert summary.main([str(old), str(new), "--markdown", str(md)]) == 0
    text = md.read_text()
    row = ["pytest", "dora/a-ws2", "F fix-holds", "!R REGRESSION", "expected ok / observed ValueError: boom"]
    assert "| " + " | ".join(md_escape(c) for c in row) + " |" in text
    assert md_escape("versions: pytest: peft 0.21.2 -> 0.22.0.dev0") in text
    # a line that is not JSON is named, never dropped silently
    assert "not a record:" in text and "new.jsonl:" in text


def test_the_plugins_own_properties_are_read(tmp_path):
    # the names the pytest plugin stamps on a cell's test (record_properties): signatures as JSON, an empty combo
    def props(verdict: str, observed: dict) -> Dict[str, Any]:
        return {
            "verdict": verdict,
            "expected": "ok",
            "expected_signature": json.dumps({"kind": "ok"}),
            "observed_signature": json.dumps(observed),
            "versions": json.dumps(VERSIONS, sort_keys=True),
            "sources": "{}",
            "combo": "",
            "device": "cpu",
            "world_size": "2",
        }

    old = _log(tmp_path, "old", [_test(CELL.format("dora/a-ws2"), "passed", props("fix-holds", {"status": "ok"}))])
    crashed = props("crash", {"status": "crash", "error_type": None})
    new = _log(tmp_path, "new", [_test(CELL.format("dora/a-ws2"), "failed", crashed)])
    rep = summary.summarise(summary.load_run(old), summary.load_run(new))
    [change] = rep.regressions
    assert (change.column, change.cell, change.old, change.new) == ("pytest", "dora/a-ws2", "fix-holds", "crash")
    assert change.line.startswith("expected ok / observed {") and '"crash"' in change.line


def test_report_logs_without_verdicts_fall_back_on_pytest_outcomes(tmp_path, capsys):
    crash = {"reprcrash": {"message": "AssertionError: expected ok / observed crash"}}
    old = _log(
        tmp_path,
        "old",
        [
            _test("tests/test_a.py::test_one", "passed"),
            _test("tests/test_a.py::test_two", "failed"),
            _test("tests/test_a.py::test_three", "passed"),
        ],
    )
    errored = _test("tests/test_a.py::test_three", "passed")
    errored[2] = _report("tests/test_a.py::test_three", "teardown", "failed")
    new = _log(
        tmp_path,
        "new",
        [
            _test("tests/test_a.py::test_one", "failed", longrepr=crash),
            _test("tests/test_a.py::test_two", "passed"),
            errored,
        ],
    )
    rep = summary.summarise(summary.load_run(old), summary.load_run(new))
    assert [(c.cell, c.old, c.new) for c in rep.regressions] == [
        ("tests/test_a.py::test_one", "passed", "failed"),
        ("tests/test_a.py::test_three", "passed", "error"),
    ]
    assert [(c.cell, c.new) for c in rep.fixes] == [("tests/test_a.py::test_two", "passed")]
    assert rep.regressions[0].line == "AssertionError: expected ok / observed crash"
    # pytest's outcomes are shown as they are, not as verdicts this version does not know ("!?")
    text = summary.render_markdown(rep)
    assert f"| {md_escape('tests/test_a.py::test_one')} | passed | failed |" in text and "!?" not in text


def test_a_results_dir_compares_with_a_report_log_of_the_same_cells(tmp_path):
    # records of one run against the report-log of the next: the same (column, case/cell) keys
    old = _results(tmp_path, "old", [make_record("a-ws2", "fix-holds", combo="installed")])
    props = {**_props("REGRESSION"), "combo": "installed"}
    new = _log(tmp_path, "new", [_test(CELL.format("dora/a-ws2"), "failed", props)])
    rep = summary.summarise(summary.load_run(old), summary.load_run(new))
    assert [(c.column, c.cell, c.old, c.new) for c in rep.regressions] == [
        ("installed", "dora/a-ws2", "fix-holds", "REGRESSION")
    ]


# ---------------------------------------------------------------------------------------------- message limit

TEXT = st.text(min_size=0, max_size=400)
VERDICTS = st.sampled_from(["fix-holds", "reproduced", "REGRESSION", "UNEXPECTED-FIX", "crash", "failed", "passed"])
CHANGES = st.lists(st.builds(Change, TEXT, TEXT, st.none() | VERDICTS, st.none() | VERDICTS, TEXT), max_size=300)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CHANGES, CHANGES, CHANGES, st.integers(0, 10**9))
def test_the_message_never_exceeds_the_limit_and_counts_what_it_leaves_out(regressions, fixes, other, cells):
    rep = summary.Summary(regressions=regressions, fixes=fixes, other=other, cells=cells)
    message = summary.render_message(rep)
    assert len(message) <= summary.MESSAGE_LIMIT
    shown = sum(1 for line in message.splitlines() if line.startswith("• "))
    total = len(regressions) + len(fixes) + len(other)
    if shown < total:
        assert message.endswith(f"… and {total - shown} more")
    else:
        assert "… and" not in message.splitlines()[-1]
    # regressions first: a fix or another change is shown only once every regression is
    if shown and shown < len(regressions):
        assert "Fixes:" not in message and "Other changes:" not in message


def test_the_tail_always_has_room_whatever_the_line_width():
    # every width of line from short to the clip: some of them fill the message to within a few characters of the
    # limit, where "… and N more" fits only if room was kept for it
    for width in range(10, summary.LINE_CHARS + 20):
        changes = [Change("c", "x" * width, "fix-holds", "REGRESSION") for _ in range(200)]
        message = summary.render_message(summary.Summary(regressions=changes))
        assert len(message) <= summary.MESSAGE_LIMIT, width
        shown = message.count("\n• ")
        assert message.endswith(f"\n… and {200 - shown} more"), width


def test_many_changes_are_cut_with_and_n_more():
    changes = [Change("installed", f"case-{i:04}/cell-{'x' * 40}-ws2", "fix-holds", "REGRESSION") for i in range(500)]
    message = summary.render_message(summary.Summary(regressions=changes, cells=500))
    assert len(message) <= summary.MESSAGE_LIMIT
    shown = message.count("\n• ")
    assert 20 < shown < 500 and message.endswith(f"… and {500 - shown} more")
    assert "case-0000/" in message  # in order: the first ones are the ones shown


def test_a_cell_now_skipped_is_in_the_summary():
    """diff.compare files a verdict that became skipped in its own group (an alert); the summary still shows it."""
    old = {"entries": {"cur": {"dora/a-ws2": {"verdict": "fix-holds"}}}, "columns": []}
    new = {"entries": {"cur": {"dora/a-ws2": {"verdict": "skipped"}}}, "columns": []}
    assert [c.cell for c in summary.summarise(old, new).other] == ["dora/a-ws2"]
