"""Tests for fsdp_matrix.export.verify, heavy: the survey of every case. One cell of each, exported and run alone
(``run_alone``), must give the verdict the matrix gives it with the installed versions (``nox -s heavy``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fsdp_matrix.cells import unmet_requirement
from fsdp_matrix.expectations import expected_for
from fsdp_matrix.export.cli import write
from fsdp_matrix.export.script import prepare
from fsdp_matrix.export.verify import installed_versions, matching_combo_id, pick_cell, run_alone
from fsdp_matrix.matrix import DEFAULT_MATRIX, load_matrix
from fsdp_matrix.verdicts import Verdict

MATRIX = load_matrix()


@pytest.mark.heavy  # 35 scripts run alone, 15-40 s each on 2 CPU cores: about 15 minutes
@pytest.mark.parametrize("case_id", [case.id for case in MATRIX.cases])
def test_every_case_gives_its_matrix_verdict_alone(tmp_path, case_id):
    versions = installed_versions(MATRIX)
    combo = matching_combo_id(MATRIX, versions)
    if combo is None:
        pytest.skip("the installed versions are no combo of matrix.yaml: no verdict to compare with")
    case = MATRIX.case(case_id)
    cell = pick_cell(case, versions)
    expected = expected_for(case, cell, versions)
    unmet = unmet_requirement(case.requires, cell)
    if unmet or expected.kind not in ("error", "ok"):
        pytest.skip(f"{case_id}/{cell.id} does not run here either: {unmet or expected.describe()}")
    exp = prepare(MATRIX, f"{case_id}/{cell.id}", combo, Path("/nonexistent"), DEFAULT_MATRIX.parent)
    script, _ = write(exp, tmp_path)
    start = time.monotonic()
    alone = run_alone(script)
    want = Verdict.REPRODUCED if expected.kind == "error" else Verdict.FIX_HOLDS
    got = alone.judge(expected).verdict
    print(
        f"{case_id}/{cell.id} ({combo}): {got.value}, {len(script.read_text().splitlines())} lines, "
        f"{time.monotonic() - start:.0f} s alone"
    )
    assert got == want, alone.output[-3000:]
