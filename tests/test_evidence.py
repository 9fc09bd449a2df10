"""Evidence files: a rule's long account in docs/pages/evidence/<case>.md, checked by validate, printed by explain."""

from __future__ import annotations

import re

from fsdp_matrix.cli import main
from fsdp_matrix.evidence import Section, for_rule, problems, read_all, read_file
from fsdp_matrix.lint import lint
from fsdp_matrix.matrix import DEFAULT_MATRIX, load_matrix
from tests.helpers import matrix_data, write_matrix

RULE = "lora-requires-grad/flatten"


def _matrix(tmp_path, pages):
    data = matrix_data()
    data["cases"][0]["expect"][0]["id"] = "flatten"
    path = write_matrix(tmp_path, data)
    folder = tmp_path / "docs" / "pages" / "evidence"
    folder.mkdir(parents=True)
    for name, text in pages.items():
        (folder / name).write_text(text)
    return load_matrix(path)


def test_sections_are_read_by_heading(tmp_path):
    (tmp_path / "c.md").write_text("# c\n\nintro\n\n## c/a\n\none\ntwo\n\n## c/b\nthree\n")
    assert read_file(tmp_path / "c.md") == [
        Section("c/a", "c.md", 5, "one\ntwo"),
        Section("c/b", "c.md", 10, "three"),
    ]
    assert for_rule(tmp_path, "c/b") == "three"
    assert (
        for_rule(tmp_path, "c/z") is None and for_rule(tmp_path, "nocase/a") is None and for_rule(None, "c/a") is None
    )


def test_problems_name_orphans_misplaced_and_repeated_sections():
    sections = [
        Section("c/a", "c.md", 3, ""),
        Section("c/gone", "c.md", 5, ""),
        Section("d/x", "c.md", 7, ""),
        Section("c/a", "c.md", 9, ""),
    ]
    assert problems(sections, {"c/a", "d/x"}) == [
        (
            "docs/pages/evidence/c.md:5",
            "section 'c/gone' names no rule of matrix.yaml (headings are ## <case>/<rule id>)",
        ),
        ("docs/pages/evidence/c.md:7", "section 'd/x' belongs in d.md"),
        ("docs/pages/evidence/c.md:9", "second section for 'c/a' (first on line 3)"),
    ]


def test_validate_reports_a_section_of_no_rule(tmp_path, capsys):
    m = _matrix(tmp_path, {"lora-requires-grad.md": f"## {RULE}\n\nseen\n\n## lora-requires-grad/renamed\n\nold\n"})
    assert [f.line() for f in lint(m)] == [
        "docs/pages/evidence/lora-requires-grad.md:5: section 'lora-requires-grad/renamed' names no rule of "
        "matrix.yaml (headings are ## <case>/<rule id>)"
    ]
    assert main(["validate", str(tmp_path / "matrix.yaml")]) == 1
    assert "lora-requires-grad/renamed" in capsys.readouterr().err


def test_a_rule_without_evidence_is_fine(tmp_path):
    assert lint(_matrix(tmp_path, {})) == []


def test_platform_sections_belong_to_platform_rules(tmp_path):
    m = _matrix(tmp_path, {"platform.md": "## platform/no-such-skip\n\nx\n"})
    assert [f.where for f in lint(m)] == ["docs/pages/evidence/platform.md:1"]


def test_explain_prints_the_evidence_of_the_rule_that_applies(tmp_path, capsys):
    _matrix(tmp_path, {"lora-requires-grad.md": f"# page\n\n## {RULE}\n\nread the flatten check\nobserved twice\n"})
    argv = ["explain", "lora-requires-grad/lora-fp32-orig0-decoder_layer-llama-ws2", "--combo", "current"]
    assert main([*argv, "--matrix", str(tmp_path / "matrix.yaml")]) == 0
    out = capsys.readouterr().out
    assert f"  evidence ({RULE}):\n    read the flatten check\n    observed twice" in out


def test_the_repo_evidence_belongs_to_rules_and_extends_their_sources():
    """Every section of docs/pages/evidence names a rule of matrix.yaml, and begins where its one-line source does
    (the long account holds all of the source; the one line is where it starts, cut short with '…' if mid-clause)."""
    matrix = load_matrix(DEFAULT_MATRIX)
    sections = read_all(matrix.evidence_dir)
    assert sections, "no evidence files found"
    sources = {case.rule_id(i): r.source for case in matrix.cases for i, r in enumerate(case.expect)}
    sources.update({f"platform/{r.id}": r.source for r in [*matrix.platform.skips, *matrix.platform.signatures]})
    ids = set(sources)
    assert problems(sections, ids) == []
    for s in sections:
        text, one = " ".join(s.text.split()), re.sub(r" …$", "", sources[s.rule]).rstrip(".")
        assert text.startswith(one), (s.rule, one)
