"""The gate's arguments (gate/request.py) through its command: what a user mistake prints, in one line, exit 2."""

from __future__ import annotations

import pytest

from fsdp_matrix.gate.cli import main

TOKEN = "s3cr3tTOKEN"
URL = f"https://user:{TOKEN}@example.invalid/peft.git"


class _NoRuns:
    def run(self, *args, **kwargs):
        raise AssertionError("a bad input got past the checks: cells ran")


def _one_line(capsys, argv) -> str:
    code = main(argv, runs=_NoRuns())
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    "pins",
    [
        [f"peft={URL}@main", "peft=/tmp"],
        [f"peft={URL}==1.0"],
        [f"peft @ git+{URL}@main", "peft==0.1.0"],
    ],
    ids=["two-pins", "version", "two-pins-pep508"],
)
def test_defect10_a_usage_error_never_prints_the_pins_credentials(tmp_path, capsys, pins) -> None:
    """Review 2026-11-28, defect 10: ``--pin: give exactly one package under test, got 2: peft=https://user:TOKEN@…``
    on stderr, i.e. in the CI log."""
    argv = [a for pin in pins for a in ("--pin", pin)] + ["--cache", str(tmp_path / "cache")]
    line = _one_line(capsys, argv)
    assert TOKEN not in line and "***@example.invalid" in line, line


# ------------------------------------------------------------------ defect 15: the smaller items of the review


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory):
    from fsdp_matrix.matrix import load_matrix
    from tests.gate.support import make_pr_repo, write_toy_matrix

    root = tmp_path_factory.mktemp("request")
    make_pr_repo(root / "toypkg")
    (root / "toypkg" / "src").mkdir()
    return root, write_toy_matrix(root, load_matrix().combo("old").pins.model_dump())


def _argv(toy, tmp_path, pin: str, *extra: str):
    root, matrix = toy
    return ["--pin", pin.format(repo=root / "toypkg"), "--matrix", str(matrix), "--combos", "toy"] + [
        "--cache", str(tmp_path / "cache"), *extra]  # fmt: skip


@pytest.mark.parametrize(
    ("head", "base"), [("main", "main"), ("main~1", "pr")], ids=["base-is-head", "head-behind-the-base"]
)
def test_defect15_a_head_that_is_the_base_or_behind_it_has_nothing_to_gate(toy, tmp_path, capsys, head, base):
    """``--pin peft=<peft>@main --base main`` and a head that is an ancestor of the base: 0 commits between,
    passed, rc 0 (the second ran every cell at the base and called it the head)."""
    line = _one_line(capsys, _argv(toy, tmp_path, "toypkg={repo}@" + head, "--base", base))
    assert "HEAD is the base (or behind it): nothing to gate" in line


@pytest.mark.parametrize(
    ("pin", "extra", "said", "not_said"),
    [
        ("toypkg={repo}", ["--cases", "nosuch"], "no case 'nosuch' in {matrix}", "in matrix.yaml"),
        ("toypkg={repo}/src@pr", [], "a folder inside the git repository {repo}", "not a git repository"),
        ("toypkg={repo}@", [], "the ref after @ is empty", "no such path"),
        ("toypkg={repo}", ["--hold", "'transformers==5.23.0'"], "--hold", "--pin \"'"),
        ("toypkg={repo}", ["--hold", "'transformers==5.23.0'"], "quotes", "--pin \"'"),
    ],
    ids=["cases-names-the-matrix", "folder-in-a-repo", "empty-ref", "hold-is-hold", "hold-quoted"],
)
def test_defect15_misleading_lines_say_what_is_wrong(toy, tmp_path, capsys, pin, extra, said, not_said) -> None:
    root, matrix = toy
    line = _one_line(capsys, _argv(toy, tmp_path, pin, *extra))
    fill = dict(repo=root / "toypkg", matrix=matrix)
    assert said.format(**fill) in line and not_said not in line, line
