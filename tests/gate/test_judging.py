"""The gate's judgement over scripted outcomes (tests/gate/support.py ``Scripted``), through its command
(``gate.cli.main``): each defect of the reliability review of 2026-11-28 that the gate's decisions had, as a scenario.

The toy pull request's head is ``pr`` (p3), its base m0; each cell's runs at either end give what the script says.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from fsdp_matrix.gate.cli import main
from fsdp_matrix.matrix import load_matrix
from tests.gate.support import Scripted, make_pr_repo, toy_bisect, toy_cells, write_toy_matrix
from tests.helpers import interrupted_in_one_line, interrupting


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("judging")
    shas = make_pr_repo(root / "toypkg")
    matrix = write_toy_matrix(root, load_matrix().combo("old").pins.model_dump(), combos=("toy", "toy2"))
    cells = toy_cells(matrix)
    return root, shas, matrix, cells["toy-fix"], cells["toy-quirk"]


def judge(toy, tmp_path: Path, script: Dict[Tuple[str, str], list], *extra: str, unbuilt=(), combos="toy", head="pr"):
    """Exit code, JSON answer, markdown and the runs of one gate of ``head`` against main over ``script``."""
    root, shas, matrix, _, _ = toy
    runs = Scripted(shas["m0"], script, unbuilt)
    out, summary = tmp_path / "gate.json", tmp_path / "summary.md"
    argv = ["--pin", f"toypkg={root / 'toypkg'}@{head}", "--combos", combos, "--matrix", str(matrix)]
    argv += ["--cache", str(tmp_path / "cache"), "--json", str(out), "--summary", str(summary), *extra]
    asked: List = []
    code = main(argv, runs=runs, bisect=toy_bisect(asked))
    runs.asked = asked  # the bisect requests
    data = json.loads(out.read_text()) if out.exists() else None
    return code, data, summary.read_text() if summary.exists() else "", runs


# ---------------------------------------------------------------- defect 1: absence is never a pass


def test_defect1_no_record_at_either_end_is_not_judged_and_fails(toy, tmp_path) -> None:
    """Both launches killed by --timeout before any record: the gate said passed, exit 0 (a PR that breaks a fix)."""
    _, _, _, fix, quirk = toy
    script = {(end, cell): [None] for end in ("base", "head") for cell in (fix, quirk)}
    code, data, md, _ = judge(toy, tmp_path, script, "--no-bisect")
    assert code == 1
    assert sorted(n["cell"] for n in data["not_judged"]) == sorted([fix, quirk])
    assert data["judged"] == 0 and "**FAILED**" in md and "2 cells, 0 judged" in md
    assert "not judged" in md.lower() and "no record for any cell" in md


def test_defect1_a_cell_missing_at_both_ends_is_not_judged(toy, tmp_path) -> None:
    """Launches cut off at both ends after some cells: the others had no result and counted as no change."""
    _, _, _, fix, quirk = toy
    code, data, md, _ = judge(toy, tmp_path, {("head", quirk): [None], ("base", quirk): [None]}, "--no-bisect")
    assert code == 1 and [n["cell"] for n in data["not_judged"]] == [quirk]
    assert data["judged"] == 1 and "2 cells, 1 judged" in md


def test_defect1_allow_missing_lets_up_to_n_cells_go_unjudged(toy, tmp_path) -> None:
    _, _, _, fix, quirk = toy
    script = {("head", quirk): [None]}
    code, data, md, _ = judge(toy, tmp_path / "1", script, "--no-bisect", "--allow-missing", "1")
    assert code == 0 and [n["cell"] for n in data["not_judged"]] == [quirk] and "not judged" in md.lower()
    script[("base", fix)] = [None]
    code, data, _, _ = judge(toy, tmp_path / "2", script, "--no-bisect", "--allow-missing", "1")
    assert code == 1 and len(data["not_judged"]) == 2


# ------------------------------------------- defects 2 and 6: confirmation that the cache and a flake cannot fool


def _change(data, cell):
    return next(c for c in data["changed"] if c["cell"] == cell)


@pytest.mark.parametrize(
    "first_base",
    [("REGRESSION", "flip marker present (a flake of the machine)"), "hang", "crash", None],
    ids=["flaky-regression", "hang", "crash", "no-record"],
)
def test_defect2_a_flaky_first_base_run_does_not_hide_a_repeatable_regression(toy, tmp_path, first_base) -> None:
    """The base's first run (cached by commit) flaked; the head failed 3 times out of 3, the base reruns held the
    fix: the change was listed as flaky, exit 0, no bisect. It is judged against the base reruns instead."""
    _, _, _, fix, _ = toy
    script = {("base", fix): [first_base, "fix-holds"], ("head", fix): [("REGRESSION", "gate bug injected")]}
    code, data, md, _ = judge(toy, tmp_path, script, "--no-bisect")
    assert code == 1 and data["flaky"] == [] and data["not_judged"] == []
    got = _change(data, fix)
    assert (got["base"]["verdict"], got["head"]["verdict"], got["kind"], got["fails"]) == (
        "fix-holds", "REGRESSION", "fix-broken", True)  # fmt: skip
    assert "**FAILED**" in md


def test_defect2_a_base_hang_equal_to_the_heads_is_rerun_before_comparing(toy, tmp_path) -> None:
    """A hang in the cached base run and a hang at the head looked alike: no change, passed."""
    _, _, _, fix, _ = toy
    code, data, _, _ = judge(toy, tmp_path, {("base", fix): ["hang", "fix-holds"], ("head", fix): ["hang"]})
    assert code == 1 and _change(data, fix)["kind"] == "fix-broken"


def test_defect6_a_cell_the_head_makes_fail_some_of_the_time_fails_the_gate(toy, tmp_path) -> None:
    """Head REGRESSION, head reruns fix-holds then REGRESSION, base reruns fix-holds twice: listed as flaky, exit 0.
    The head does not repeat, but it fails where the base never does: the pull request made the cell flaky."""
    _, _, _, fix, _ = toy
    script = {("head", fix): ["REGRESSION", "fix-holds", "REGRESSION"]}
    code, data, md, _ = judge(toy, tmp_path, script)
    assert code == 1 and data["flaky"] == []
    got = _change(data, fix)
    assert (got["kind"], got["fails"], got["bisect"]) == ("made-flaky", True, None)  # a flake is not bisected
    assert "made flaky" in md


def test_defect6_the_heads_records_are_not_read_back_from_the_cache(toy, tmp_path) -> None:
    """The head's records were kept by commit: a re-run of the job read the lucky pass back and passed again."""
    _, _, _, fix, quirk = toy
    _, _, _, runs = judge(toy, tmp_path, {})
    assert [(end, fresh) for _, end, _, fresh in runs.calls] == [("base", False), ("head", True)]


def test_a_head_that_alternates_between_passing_verdicts_is_flaky_and_passes(toy, tmp_path) -> None:
    _, _, _, _, quirk = toy
    script = {("base", quirk): ["reproduced"], ("head", quirk): ["UNEXPECTED-FIX", "reproduced", "UNEXPECTED-FIX"]}
    code, data, _, _ = judge(toy, tmp_path, script)
    assert code == 0 and [c["cell"] for c in data["flaky"]] == [quirk]


# ------------------------------------------------- defect 9: one combo that cannot be built hides nothing else


def test_defect9_an_unbuildable_base_on_one_combo_does_not_hide_a_failing_change_on_another(toy, tmp_path) -> None:
    """``--combos toy,toy2``, toy2's base does not build, toy has fix-holds -> REGRESSION: exit 2 'cannot judge',
    the failing change only in the table, and no bisect for any combo."""
    _, _, _, fix, _ = toy
    script = {("head", fix): ["REGRESSION"]}
    code, data, md, runs = judge(toy, tmp_path, script, unbuilt=[("toy2", "base")], combos="toy,toy2")
    assert code == 1
    assert [(c["combo"], c["kind"]) for c in data["changed"]] == [("toy", "fix-broken")]
    assert len(data["problems"]) == 1 and data["problems"][0].startswith("toy2: the base")
    assert [r.combo for r in runs.asked] == ["toy"]  # the judged combo is bisected
    head = md.splitlines()[2]
    assert head.startswith("**FAILED**") and "toy2: the base" in md


# ------------------------------------------------------------ defect 8: SIGTERM and Ctrl-C end the gate in one line


@pytest.mark.parametrize("how, code, said", [("sigint", 130, "interrupted"), ("sigterm", 143, "terminated")])
def test_defect8_ctrl_c_and_sigterm_end_the_gate_and_its_launch_in_one_line(toy, tmp_path, capsys, how, code, said):
    """SIGTERM killed the gate and left its launch running unsupervised; Ctrl-C printed a 12-frame traceback."""
    root, _, matrix, _, _ = toy
    ended: List = []

    class Interrupted:
        run = staticmethod(interrupting(how, ended))

    argv = ["--pin", f"toypkg={root / 'toypkg'}@pr", "--combos", "toy", "--matrix", str(matrix)]
    argv += ["--cache", str(tmp_path / "cache")]
    interrupted_in_one_line(functools.partial(main, runs=Interrupted()), argv, capsys, code, said, ended)


# ------------------------------------------------------------ defect 15: skipped at the head, a silent combo


def test_defect15_a_verdict_that_becomes_skipped_at_the_head_fails(toy, tmp_path) -> None:
    """fix-holds -> skipped was 'changed', not failing: a cell the pull request stopped exercising passed."""
    _, _, _, fix, _ = toy
    code, data, md, _ = judge(toy, tmp_path, {("head", fix): ["skipped"]}, "--no-bisect")
    assert code == 1 and (_change(data, fix)["kind"], _change(data, fix)["fails"]) == ("now-skipped", True)
    assert "skipped at the head" in md


def test_defect15_a_combo_that_goes_silent_at_the_head_fails_whatever_allow_missing_says(toy, tmp_path) -> None:
    _, _, _, fix, quirk = toy
    script = {("head", fix): [None], ("head", quirk): [None]}
    code, data, md, _ = judge(toy, tmp_path, script, "--no-bisect", "--allow-missing", "10")
    assert code == 1 and data["silent"] == ["toy"] and "silent" in md


def test_a_ref_with_a_slash_is_the_head_as_docs_gate_md_says(toy, tmp_path) -> None:
    """docs/pages/gate.md said a ref with a slash "reads as part of the path: give its SHA"; the review found that
    ``--pin peft=<peft>@fix/slash`` works (the docs now say so; this keeps them true)."""
    from tests.sources_support import git

    root, shas, _, fix, _ = toy
    git(root / "toypkg", "branch", "-f", "fix/slash", "pr")
    code, data, _, _ = judge(toy, tmp_path, {("head", fix): ["REGRESSION"]}, "--no-bisect", head="fix/slash")
    assert code == 1 and data["head"] == shas["p3"] and data["base"] == shas["m0"]
