"""The combined report: grid model, terminal/markdown/JSON output and the ``report`` entry point."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from fsdp_matrix.matrix import parse_matrix
from fsdp_matrix.records import append, iter_records
from fsdp_matrix.report import cli as report_cli
from fsdp_matrix.report import json as report_json
from fsdp_matrix.report import markdown, style
from fsdp_matrix.report import text as report_text
from fsdp_matrix.report.grid import LOCAL, build_grid
from fsdp_matrix.report.style import MISSING
from tests.report.samples import HOSTILE, MATRIX, STATUS, make_record, sample_records


def test_grid_orders_by_matrix_and_keeps_newest():
    recs = sample_records() + [make_record("lora-ws2", "crash", "old", case="zeta", finished_at=2000.0)]
    grid = build_grid(recs, parse_matrix(MATRIX))
    assert [c.id for c in grid.columns] == ["new", "old"]
    # zeta comes first in matrix.yaml, and its lora cell expands before dora
    assert [r.key for r in grid.rows] == ["zeta/lora-ws2", "zeta/dora-ws2", "alpha/lora-ws2"]
    assert grid.unrun == ["never"]
    old = grid.columns[1]
    assert grid.code(old, grid.rows[0]) == "crash"  # the newer re-run supersedes fix-holds
    assert grid.code(old, grid.rows[2]) == MISSING
    assert grid.counts(old)["crash"] == 1 and grid.counts(old)[MISSING] == 1 and grid.counts(old)["fix-holds"] == 0


def test_grid_without_matrix_orders_by_name_and_names_local_column():
    recs = [
        make_record("b-ws2", "fix-holds", None),
        make_record("a-ws2", "fix-holds", "zz"),
        make_record("a-ws2", "reproduced", "aa"),
    ]
    grid = build_grid(recs)
    assert [c.id for c in grid.columns] == ["aa", "zz", LOCAL]
    recs = [make_record("a-ws2", "fix-holds", combo) for combo in ("t2.10", "t2.3", "t1")]
    assert [c.id for c in build_grid(recs).columns] == ["t1", "t2.3", "t2.10"]
    assert grid.columns[2].label == "peft 0.21.2 / transformers 5.23.0"
    assert [r.key for r in grid.rows] == ["dora/a-ws2", "dora/b-ws2"]


def test_attention_lists_every_problem_most_severe_first():
    grid = build_grid(sample_records(), parse_matrix(MATRIX))
    assert [(r.key, c.id, rec.verdict) for r, c, rec in grid.attention()] == [
        ("zeta/dora-ws2", "old", "REGRESSION"),
        ("zeta/dora-ws2", "new", "hang"),
    ]


def test_text_table_has_symbols_counts_and_attention_lines():
    text = report_text.render_text(build_grid(sample_records(), parse_matrix(MATRIX)))
    lines = text.splitlines()
    dora = next(line for line in lines if line.strip().startswith("dora-ws2"))
    assert dora.split()[1:] == ["!H", "!R"]
    assert "Needs attention (2):" in text
    assert any(
        line.strip().startswith("!R") and "[2 old] zeta/dora-ws2: expected ok / observed error" in line
        for line in lines
    )
    assert "Combos in matrix.yaml with no record: never" in text
    assert "\x1b" not in text and "\\x1b[31mred" in text  # terminal escapes in messages are shown, not obeyed
    counts = next(line for line in lines if line.split()[:2] == ["1", "new"])
    # columns: R F - . !R !U !D !H !C !E
    assert counts.split()[2:12] == ["1", "0", "1", "0", "0", "0", "0", "1", "0", "0"]


def test_text_table_scales_to_many_combos():
    recs = [
        make_record(f"c{i}-ws2", "fix-holds", f"combo-with-a-long-name-{j:02d}") for i in range(100) for j in range(16)
    ]
    text = report_text.render_text(build_grid(recs))
    grid_lines = [line for line in text.splitlines() if line.startswith("  c")]
    assert len(grid_lines) == 100
    assert max(len(line) for line in grid_lines) < 100  # numbered columns, not 16 long headers


def test_markdown_escapes_and_step_summary_appends(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    md = markdown.render_markdown(build_grid(sample_records(), parse_matrix(MATRIX)))
    assert markdown.append_step_summary(md, {"GITHUB_STEP_SUMMARY": str(summary)}) == summary
    written = summary.read_text()
    assert written.startswith("earlier step\n") and written.endswith(md)
    assert "<script>" not in md and "\\<script\\>" in md
    assert "\\| pipe" in md  # a pipe in a message must not split the table row
    assert markdown.append_step_summary(md, {}) is None


def test_step_summary_is_capped(tmp_path):
    summary = tmp_path / "summary.md"
    markdown.append_step_summary("x" * (2 * 1024 * 1024), {"GITHUB_STEP_SUMMARY": str(summary)})
    assert summary.stat().st_size <= markdown.STEP_SUMMARY_LIMIT
    assert summary.read_text().endswith("report.md)*\n")


def test_json_has_grid_counts_and_summaries():
    data = json.loads(json.dumps(report_json.to_json(build_grid(sample_records(), parse_matrix(MATRIX)))))
    assert [c["id"] for c in data["columns"]] == ["new", "old"]
    assert data["entries"]["old"]["zeta/dora-ws2"]["verdict"] == "REGRESSION"
    assert data["entries"]["old"]["zeta/dora-ws2"]["error_message"] == HOSTILE
    assert "alpha/lora-ws2" not in data["entries"]["old"]
    assert data["counts"]["new"]["hang"] == 1 and data["counts"]["old"][MISSING] == 1
    assert data["unrun_combos"] == ["never"]


def test_main_writes_every_format_and_tolerates_torn_line(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    for rec in sample_records():
        append(results / rec.combo, rec)
    append(results, make_record("lora-ws2", "fix-holds", None, case="alpha"))
    with open(results / "new" / "cells.jsonl", "a") as fh:
        fh.write('{"case": "zeta", "cell": "torn')  # a run killed mid-write
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out = tmp_path / "out"
    assert report_cli.main([str(results), "--out", str(out), "--matrix", str(_write_matrix(tmp_path))]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "junit-_local.xml",
        "junit-new.xml",
        "junit-old.xml",
        "report.html",
        "report.json",
        "report.md",
        "report.txt",
    ]
    printed = capsys.readouterr().out
    assert printed.startswith((out / "report.txt").read_text())
    assert "!R" in printed and summary.read_text() == (out / "report.md").read_text()
    assert len(list(iter_records(results))) == 6  # the torn line is skipped, not fatal


def test_main_format_selection_and_bad_input(tmp_path, capsys):
    results = tmp_path / "results"
    append(results, make_record("a-ws2", "fix-holds", None))
    assert report_cli.main([str(results), "--format", "json", "--format", "junit"]) == 0
    assert sorted(p.name for p in results.iterdir() if not p.name.startswith("cells")) == [
        "junit-_local.xml",
        "report.json",
    ]
    assert report_cli.main([str(tmp_path / "nope")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert report_cli.main([str(tmp_path / "empty")]) == 2
    (results / "cells.jsonl").write_text("not json\n{}\n")
    assert report_cli.main([str(results)]) == 2
    err = capsys.readouterr().err
    assert "no cell records" in err and "2 lines of cells.jsonl could not be read" in err


def _write_matrix(tmp_path: Path) -> Path:
    import yaml

    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(MATRIX))
    return path


@pytest.mark.parametrize("verdict", list(STATUS) + ["SOMETHING-NEW"])
def test_every_verdict_has_a_symbol_and_attention_matches_verdicts(verdict):
    from fsdp_matrix.verdicts import Verdict

    sym = style.symbol(verdict)
    expected = Verdict(verdict).needs_attention if verdict in STATUS else True
    assert style.needs_attention(verdict) is expected
    assert sym.startswith("!") is expected
    assert html.escape(sym) == sym


@pytest.mark.parametrize(
    "field,value",
    [("duration_s", "fast"), ("finished_at", "yesterday"), ("versions", "torch 2.13"), ("observed", [])],
)
def test_report_skips_a_wrong_typed_line_and_says_so(tmp_path, capsys, field, value):
    """A wrong-typed field costs its line, which the report counts and names, not the whole report."""
    results = tmp_path / "results"
    append(results, make_record("a-ws2", "fix-holds", "new", case="zeta"))
    bad = make_record("b-ws2", "fix-holds", "new", case="zeta").to_json()
    bad[field] = value
    with open(results / "cells.jsonl", "a") as fh:
        fh.write(json.dumps(bad) + "\n")
    append(results, make_record("c-ws2", "REGRESSION", "new", case="zeta"))
    assert report_cli.main([str(results)]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert f"cells.jsonl:2: skipped: {field}" in captured.err
    text = (results / "report.txt").read_text()
    assert "1 line of cells.jsonl could not be read" in text and "zeta/c-ws2" in text
    assert "2 cells" in text
    assert "1 line" in (results / "report.md").read_text() and "1 line" in (results / "report.html").read_text()


def test_plain_run_and_a_combo_named_local_get_their_own_junit_file(tmp_path):
    """Records without a combo and records of a combo called ``local`` must not share junit-local.xml."""
    results = tmp_path / "results"
    append(results / "plain", make_record("a-ws2", "REGRESSION", None))
    append(results / "local", make_record("a-ws2", "fix-holds", "local"))
    assert report_cli.main([str(results), "--format", "junit", "--out", str(tmp_path / "out")]) == 0
    files = sorted((tmp_path / "out").glob("junit-*.xml"))
    assert len(files) == 2
    failures = sorted(f.read_text().count("<failure") for f in files)
    assert failures == [0, 1]


def _escape_everywhere(text: str) -> str:
    return text + "\x1b[2J\x1b]0;pwned\x07\x9b31m"


def test_text_report_shows_no_terminal_escape_from_any_record_field(tmp_path, capsys):
    """Every string a record carries, and the case title, reaches the terminal with its escapes shown."""
    evil = _escape_everywhere
    rec = make_record(evil("cell-ws2"), "REGRESSION", evil("combo"), case=evil("case"), message=evil("boom"))
    rec.line = evil(rec.line)
    rec.observed.location = evil("loc")
    rec.versions = {evil("torch"): evil("2.13.0"), "peft": evil("0.21.2")}
    rec.host, rec.run_id, rec.device = evil("host"), evil("run"), evil("cpu")
    for rank in rec.observed.ranks:
        rank.status, rank.signal, rank.error_type = evil("error"), evil("SIGX"), evil("E")
        rank.traceback, rank.stack = evil("Traceback"), evil("stack")
    matrix = {**MATRIX, "cases": [{**MATRIX["cases"][0], "id": "zeta", "title": evil("title")}]}
    grid = build_grid([rec, make_record("x-ws2", "fix-holds", "new", case="zeta")], parse_matrix(matrix))
    grid.case_titles[rec.case] = evil("title")
    outputs = {
        "render_text": report_text.render_text(grid),
        "summary_line": report_text.summary_line(grid),
        "one_line": report_text.one_line(rec.line),
    }
    results = tmp_path / "results"
    append(results, rec)
    assert report_cli.main([str(results), "--format", "text"]) == 0
    outputs["report main (stdout)"] = capsys.readouterr().out
    outputs["report.txt"] = (results / "report.txt").read_text()
    for name, text in outputs.items():
        assert not [c for c in text if c not in "\n" and (ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0)], name
    assert "\\x1b[2J" in outputs["render_text"]  # shown, not dropped: a reader can still see what was there


def test_defect20_an_env_that_cannot_be_installed_is_reported_once_per_combo():
    """A combo whose env cannot be installed gave "Needs attention (202)" and one line per cell;
    it is one line per combo (the reason and the command that re-runs it), in the terminal, markdown and HTML."""
    from dataclasses import replace

    from fsdp_matrix.records import env_error
    from fsdp_matrix.report.html import render_html

    why = "refusing to download a CUDA build of torch 2.1.2: point pip or uv at a CPU build"
    broken = [
        replace(make_record(cell, "env-error", "old", case=case), observed=env_error(why), line=f"env-error ({why})")
        for case, cell in (("zeta", "lora-ws2"), ("zeta", "dora-ws2"), ("alpha", "lora-ws2"))
    ]
    grid = build_grid(broken + [make_record("dora-ws2", "REGRESSION", "new", case="zeta")], parse_matrix(MATRIX))
    fix = 'nox -s "matrix(old)" -- --resume'
    text = report_text.render_text(grid).split("Needs attention", 1)[1]
    md = markdown.render_markdown(grid).split("### Needs attention", 1)[1]
    page = render_html(grid)
    attention = page.split("<h2>Needs attention", 1)[1].split('<section class="pane"', 1)[0]
    for name, out in (("text", text), ("markdown", md), ("html", attention)):
        assert out.count("CUDA build of torch 2.1.2") == 1, name
        assert "3 cells" in out, name
        assert out.count("zeta/dora-ws2") == 1, name  # the REGRESSION's own line; the env-error cells are counted
    assert fix in text and md.count(markdown.md_escape(fix)) == 1 and html.escape(fix) in attention


def test_an_env_that_did_not_build_from_a_pinned_source_is_rerun_with_that_pin():
    """An env that failed to build from ``--pin peft=PATH@REF`` was told to rerun ``nox -s "matrix(old)" --
    --resume``: without the pin, that builds the release env and answers another question."""
    from dataclasses import replace

    from fsdp_matrix.records import env_error

    why = "install failed: peft @ file:///src/peft: not a Python project"
    commit = "5d602fdbff04c33c1c4d" + "0" * 20
    built = {"peft": {"url": "/src/my peft", "ref": "fix/x", "commit": commit, "dirty": None, "release": None}}
    broken = replace(make_record("lora-ws2", "env-error", "old", case="zeta"), observed=env_error(why), sources=built)
    [failure] = build_grid([broken], parse_matrix(MATRIX)).env_failures()
    assert failure.rerun == "nox -s \"matrix(old)\" -- --resume --pin 'peft=/src/my peft@fix/x'"


def test_a_line_that_is_not_a_record_needs_attention_with_its_position(tmp_path, capsys):
    """A line no reader can parse is quarantined with its file and line, and counted among what needs attention:
    never only a quiet "could not be read"."""
    results = tmp_path / "results"
    append(results, make_record("a-ws2", "fix-holds", "new", case="zeta"))
    with open(results / "cells.jsonl", "a") as fh:
        fh.write("{garbage\n")
    assert report_cli.main([str(results)]) == 0
    text = (results / "report.txt").read_text()
    assert "1 need attention" in text.splitlines()[0]
    assert "Needs attention (1):" in text and "cells.jsonl:2: quarantined" in text


def test_a_cell_no_longer_in_matrix_yaml_is_listed_apart_and_can_be_pruned(tmp_path, capsys):
    """A removed cell's REGRESSION stayed under "Needs attention", and nothing said how to prune such records."""
    gone = make_record("qlora-ws2", "REGRESSION", "old", case="zeta")
    removed_case = make_record("lora-ws2", "hang", "old", case="removed")
    grid = build_grid([*sample_records(), gone, removed_case], parse_matrix(MATRIX))
    assert grid.gone == ["removed/lora-ws2", "zeta/qlora-ws2"]
    assert all(r.key not in grid.gone for r, _, _ in grid.attention())
    text = report_text.render_text(grid)
    assert "Not in matrix.yaml (2)" in text and "--prune" in text
    assert text.index("Needs attention") < text.index("Not in matrix.yaml")
    assert "zeta/qlora-ws2" not in text.split("Not in matrix.yaml")[0].split("Needs attention")[1]
    assert "Not in matrix.yaml (2)" in markdown.render_markdown(grid)
    assert report_json.to_json(grid)["not_in_matrix"] == grid.gone
    results = tmp_path / "results"
    for rec in [*sample_records(), gone, removed_case]:
        append(results / rec.combo, rec)
    matrix = _write_matrix(tmp_path)
    assert report_cli.main([str(results), "--matrix", str(matrix), "--prune", "--format", "json"]) == 0
    assert "moved 2 records of 2 cells" in capsys.readouterr().out
    pruned = list(iter_records(results / "old" / "cells.pruned.jsonl"))
    assert sorted(r.key for r in pruned) == ["removed/lora-ws2", "zeta/qlora-ws2"]
    assert json.loads((results / "report.json").read_text())["not_in_matrix"] == []
