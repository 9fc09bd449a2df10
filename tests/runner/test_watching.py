"""Watching a launch: an End event that cannot be read is that cell's error, never the launch's end."""

from __future__ import annotations

from tests.runner.hostile import run_sequence


def test_a_non_dict_return_is_that_cells_error_and_the_launch_goes_on(tmp_path):
    """Issue 17 defect 1: ``return True`` (or a list, or a dict with non-JSON keys) made the End event fail
    validation; that cell and every later one got no record and no cells.jsonl was written."""
    faults = ["probe", "ret_bool", "probe", "ret_list", "probe", "ret_bad_keys", "probe"]
    recs = run_sequence(tmp_path, faults)
    assert all(r is not None for r in recs), "a cell got no record"
    by_fault = list(zip(faults, recs))
    assert [r.verdict for f, r in by_fault if f == "probe"] == ["fix-holds"] * 4
    for fault, what in (("ret_bool", "bool"), ("ret_list", "list"), ("ret_bad_keys", "dict")):
        [rec] = [r for f, r in by_fault if f == fault]
        assert rec.observed.status == "error" and rec.verdict == "REGRESSION", rec.line
        assert "run() returned" in rec.line and what in rec.line, rec.line
