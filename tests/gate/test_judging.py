"""The gate's judgement over scripted outcomes (tests/gate/support.py ``Scripted``), through its command
(``gate.cli.main``): each defect of the reliability review of 2026-11-28 that the gate's decisions had, as a scenario.

The toy pull request's head is ``pr`` (p3), its base m0; each cell's runs at either end give what the script says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from fsdp_matrix.gate.cli import main
from fsdp_matrix.matrix import load_matrix
from tests.gate.support import Scripted, make_pr_repo, toy_bisect, toy_cells, write_toy_matrix


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("judging")
    shas = make_pr_repo(root / "toypkg")
    matrix = write_toy_matrix(root, load_matrix().combo("old").pins.model_dump(), combos=("toy", "toy2"))
    cells = toy_cells(matrix)
    return root, shas, matrix, cells["toy-fix"], cells["toy-quirk"]


def judge(toy, tmp_path: Path, script: Dict[Tuple[str, str], list], *extra: str, unbuilt=(), combos="toy"):
    """Exit code, JSON answer, markdown and the runs of one gate of ``pr`` against main over ``script``."""
    root, shas, matrix, _, _ = toy
    runs = Scripted(shas["m0"], script, unbuilt)
    out, summary = tmp_path / "gate.json", tmp_path / "summary.md"
    argv = ["--pin", f"toypkg={root / 'toypkg'}@pr", "--combos", combos, "--matrix", str(matrix)]
    argv += ["--cache", str(tmp_path / "cache"), "--json", str(out), "--summary", str(summary), *extra]
    asked: List = []
    code = main(argv, runs=runs, bisect=toy_bisect(asked))
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
