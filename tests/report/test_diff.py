"""Nightly diff: verdict changes grouped, exit 1 exactly on a new REGRESSION, exit 2 on unreadable input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

from fsdp_matrix.records import Record, append
from fsdp_matrix.report import cli as report_cli
from fsdp_matrix.report import diff
from tests.report.samples import make_record


def _results(tmp_path: Path, name: str, records: List[Record]) -> Path:
    root = tmp_path / name
    for rec in records:
        append(root / (rec.combo or ""), rec)
    return root


def _report_json(tmp_path: Path, name: str, records: List[Record]) -> Path:
    out = tmp_path / f"{name}-out"
    assert report_cli.main([str(_results(tmp_path, name, records)), "--out", str(out), "--format", "json"]) == 0
    return out / "report.json"


BASE = [make_record("a-ws2", "fix-holds"), make_record("b-ws2", "reproduced"), make_record("c-ws2", "REGRESSION")]


def test_new_regression_exits_1_and_is_listed_first(tmp_path, capsys):
    new = [make_record("a-ws2", "REGRESSION"), make_record("b-ws2", "reproduced"), make_record("c-ws2", "REGRESSION")]
    assert diff.main([str(_results(tmp_path, "old", BASE)), str(_results(tmp_path, "new", new))]) == 1
    out = capsys.readouterr().out
    assert "NEW REGRESSIONS (1):" in out and "[cur] dora/a-ws2: F fix-holds -> !R REGRESSION" in out
    assert "c-ws2" not in out  # a regression already there last night is not new


def test_fixed_regression_exits_0_and_shows_as_a_change(tmp_path, capsys):
    new = [make_record("a-ws2", "fix-holds"), make_record("b-ws2", "reproduced"), make_record("c-ws2", "fix-holds")]
    old_json, new_json = _report_json(tmp_path, "old", BASE), _report_json(tmp_path, "new", new)
    assert diff.main([str(old_json), str(new_json)]) == 0
    out = capsys.readouterr().out
    assert "Other verdict changes (1):" in out and "dora/c-ws2: !R REGRESSION -> F fix-holds" in out
    assert "NEW REGRESSIONS" not in out
    # and back again: the same pair the other way round is a new regression
    assert diff.main([str(new_json), str(old_json)]) == 1


def test_identical_reports_exit_0(tmp_path, capsys):
    results = _results(tmp_path, "same", BASE)
    assert diff.main([str(results), str(results)]) == 0
    assert "No verdict changed." in capsys.readouterr().out


def test_groups_unexpected_fixes_added_removed_and_versions(tmp_path):
    moved = dict(make_record("x", "fix-holds").versions, peft="0.22.0")
    old = BASE + [make_record("gone-ws2", "fix-holds")]
    new = [
        make_record("a-ws2", "fix-holds", versions=moved),
        make_record("b-ws2", "UNEXPECTED-FIX"),
        make_record("c-ws2", "hang"),
        make_record("d-ws2", "skipped"),
        make_record("a-ws2", "REGRESSION", combo="brand-new"),
    ]
    result = diff.compare(
        diff.load_report(_results(tmp_path, "old", old)), diff.load_report(_results(tmp_path, "new", new))
    )
    names = lambda changes: [(c.column, c.cell, c.old, c.new) for c in changes]  # noqa: E731
    assert names(result.regressions) == [("brand-new", "dora/a-ws2", None, "REGRESSION")]  # a new combo counts
    assert names(result.unexpected_fixes) == [("cur", "dora/b-ws2", "reproduced", "UNEXPECTED-FIX")]
    assert names(result.changed) == [("cur", "dora/c-ws2", "REGRESSION", "hang")]
    assert names(result.added) == [("cur", "dora/d-ws2", None, "skipped")]
    assert names(result.removed) == [("cur", "dora/gone-ws2", "fix-holds", None)]
    assert result.versions == ["cur: peft 0.21.2 -> 0.22.0"]
    text = diff.render(result)
    assert text.index("NEW REGRESSIONS") < text.index("unexpected fixes") < text.index("Cells removed")


def test_a_package_an_older_record_schema_did_not_record_is_no_version_change(tmp_path):
    """A schema-1 night (no ``versions.trl``: schema 4 added it) against a schema-4 night said ``trl - -> 1.16.0``
    under Versions changed; trl was not recorded, not absent. A package the env gained (None -> x) is a change."""
    import dataclasses

    old = [dataclasses.replace(r, schema=1) for r in BASE]  # versions as schema 1 wrote them: no trl key
    new = [dataclasses.replace(r, versions={**r.versions, "trl": "1.16.0"}) for r in BASE]
    result = diff.compare(
        diff.load_report(_results(tmp_path, "old", old)), diff.load_report(_results(tmp_path, "new", new))
    )
    assert result.versions == []
    gained = [dataclasses.replace(r, versions={**r.versions, "trl": None}) for r in BASE]
    result = diff.compare(
        diff.load_report(_results(tmp_path, "gained", gained)), diff.load_report(_results(tmp_path, "new2", new))
    )
    assert result.versions == ["cur: trl - -> 1.16.0"]


def test_torn_last_line_is_tolerated(tmp_path):
    old = _results(tmp_path, "old", BASE)
    new = _results(tmp_path, "new", [make_record("a-ws2", "fix-holds")])
    with open(new / "cur" / "cells.jsonl", "a") as fh:
        fh.write(json.dumps(make_record("b-ws2", "REGRESSION").to_json())[:120])  # killed mid-write
    result = diff.compare(diff.load_report(old), diff.load_report(new))
    assert result.regressions == [] and [c.cell for c in result.removed] == ["dora/b-ws2", "dora/c-ws2"]


def test_unreadable_input_exits_2_with_one_line(tmp_path, capsys):
    good = _results(tmp_path, "good", BASE)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    other_json = tmp_path / "other.json"
    other_json.write_text('{"hello": 1}')
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "cells.jsonl").write_text("garbage\n")
    (tmp_path / "empty").mkdir()
    for bad in (tmp_path / "missing.json", bad_json, other_json, corrupt, tmp_path / "empty"):
        assert diff.main([str(good), str(bad)]) == 2, bad
        assert diff.main([str(bad), str(good)]) == 2, bad
        err = capsys.readouterr().err
        assert err.startswith("diff: ") and len(err.strip().splitlines()) == 2  # one line per call


def test_defect9_a_passing_cell_that_now_needs_attention_is_an_alert(tmp_path, capsys):
    """Fix-holds -> crash, hang, env-error, DIFFERENT-ERROR was "Other verdict changes", exit 0."""
    old = [make_record(f"{n}-ws2", "fix-holds") for n in "abcd"] + [make_record("e-ws2", "reproduced")]
    old += [make_record("f-ws2", "REGRESSION"), make_record("g-ws2", "reproduced")]
    new = [make_record("a-ws2", "crash"), make_record("b-ws2", "hang"), make_record("c-ws2", "env-error")]
    new += [make_record("d-ws2", "DIFFERENT-ERROR"), make_record("e-ws2", "hang"), make_record("f-ws2", "crash")]
    new += [make_record("g-ws2", "skipped")]
    result = diff.compare(
        diff.load_report(_results(tmp_path, "old", old)), diff.load_report(_results(tmp_path, "new", new))
    )
    assert [c.cell for c in result.broken] == [f"dora/{n}-ws2" for n in "abcde"]
    # a cell that was already failing is a change but no alert (one now skipped is an alert of its own: see below)
    assert [c.cell for c in result.changed] == ["dora/f-ws2"]
    assert diff.main([str(tmp_path / "old"), str(tmp_path / "new")]) == 1
    out = capsys.readouterr().out
    assert "Passing cells that now need attention (5):" in out and "dora/a-ws2: F fix-holds -> !C crash" in out


def test_a_line_of_new_that_is_not_a_record_is_an_alert(tmp_path, capsys):
    """A record nobody can read hides its verdict: the diff names the line and exits 1, whatever else changed."""
    old = _results(tmp_path, "old", BASE)
    new = _results(tmp_path, "new", BASE)
    with open(new / "cur" / "cells.jsonl", "a") as fh:
        fh.write('{"case": "dora", "cell": "a-ws2", "observed": "\\udcff"}\n')
    assert diff.main([str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "Lines that are not records (1):" in out and "cells.jsonl:4" in out


def _two_combos(tmp_path: Path) -> Path:
    return _results(tmp_path, "old", BASE + [make_record(c.cell, c.verdict, combo="nightly") for c in BASE])


def test_a_combo_missing_tonight_is_an_alert(tmp_path, capsys):
    old = _two_combos(tmp_path)
    assert diff.main([str(old), str(_results(tmp_path, "new", BASE))]) == 1
    out = capsys.readouterr().out
    assert "Records lost (1):" in out and "nightly: 3 records in OLD, none in NEW" in out


def test_an_empty_results_file_is_an_alert(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "cells.jsonl").write_text("")  # a run that died after creating it
    assert diff.main([str(_two_combos(tmp_path)), str(tmp_path / "empty")]) == 1
    out = capsys.readouterr().out
    assert "Records lost (2):" in out and "cur: 3 records in OLD, none in NEW" in out


def test_a_report_json_with_no_entries_is_an_alert(tmp_path, capsys):
    good = _report_json(tmp_path, "old", BASE)
    data = json.loads(good.read_text())
    data["entries"], data["columns"] = {}, []
    hollow = tmp_path / "hollow.json"
    hollow.write_text(json.dumps(data))
    assert diff.main([str(good), str(hollow)]) == 1
    assert "cur: 3 records in OLD, none in NEW" in capsys.readouterr().out


def test_records_that_drop_beyond_the_threshold_are_an_alert(tmp_path, capsys):
    old = [make_record(f"{n}-ws2", "fix-holds") for n in "abcdefgh"]
    old_dir = _results(tmp_path, "old", old)
    # one cell dropped of eight (12.5 %): a cell taken out of matrix.yaml, listed but no alert
    assert diff.main([str(old_dir), str(_results(tmp_path, "new7", old[1:]))]) == 0
    # three of eight (37.5 %): more than the default quarter
    assert diff.main([str(old_dir), str(_results(tmp_path, "new5", old[3:]))]) == 1
    assert "cur: records dropped from 8 to 5" in capsys.readouterr().out
    assert diff.main([str(old_dir), str(_results(tmp_path, "new5b", old[3:])), "--max-drop", "0.5"]) == 0


def test_with_confirmation_moves_a_flaky_flip_apart_and_it_is_no_alert(tmp_path):
    new = [make_record("a-ws2", "REGRESSION"), make_record("b-ws2", "crash"), make_record("c-ws2", "REGRESSION")]
    got = diff.compare(
        diff.load_report(_results(tmp_path, "old", BASE)), diff.load_report(_results(tmp_path, "new", new))
    )
    assert len(got.alerts) == 2
    marked = diff.with_confirmation(got, {("cur", "dora/a-ws2"): "confirmed", ("cur", "dora/b-ws2"): "flaky"})
    assert [c.cell for c in marked.flaky] == ["dora/b-ws2"] and not marked.broken
    assert [(c.cell, c.confirmation) for c in marked.regressions] == [("dora/a-ws2", "confirmed")]
    assert len(marked.alerts) == 1
    text = diff.render(marked)
    assert "Flaky: reruns did not repeat the flip (no alert, not bisected) (1):" in text
    assert "dora/a-ws2: F fix-holds -> !R REGRESSION (confirmed)" in text


def test_a_cell_flaky_last_night_is_compared_by_the_verdict_its_reruns_settled_on(tmp_path, capsys):
    """Last night's one-off crash (reruns: fix-holds) is no change when the cell passes tonight."""
    from fsdp_matrix.records import Confirmation

    flaky = make_record("a-ws2", "crash")
    flaky.confirmation = Confirmation(status="flaky", previous="fix-holds", reruns=["fix-holds", "fix-holds"])
    old = _report_json(tmp_path, "old", [flaky, *BASE[1:]])
    assert json.loads(old.read_text())["entries"]["cur"]["dora/a-ws2"]["confirmation"]["status"] == "flaky"
    assert diff.main([str(old), str(_results(tmp_path, "new", BASE))]) == 0
    assert "No verdict changed." in capsys.readouterr().out


def test_a_verdict_that_becomes_skipped_is_an_alert(tmp_path, capsys):
    """A skip hides the cell: reproduced, fix-holds or REGRESSION -> skipped was an "other verdict change", exit 0."""
    old = [make_record("a-ws2", "reproduced"), make_record("b-ws2", "fix-holds"), make_record("c-ws2", "REGRESSION")]
    old += [make_record("d-ws2", "skipped")]
    new = [make_record(f"{n}-ws2", "skipped") for n in "abcd"]
    result = diff.compare(
        diff.load_report(_results(tmp_path, "old", old)), diff.load_report(_results(tmp_path, "new", new))
    )
    assert [c.cell for c in result.skipped] == [f"dora/{n}-ws2" for n in "abc"]
    assert len(result.alerts) == 3
    assert diff.main([str(tmp_path / "old"), str(tmp_path / "new")]) == 1
    assert "Cells now skipped (3):" in capsys.readouterr().out
