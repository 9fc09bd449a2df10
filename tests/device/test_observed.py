"""The kept GPU records (docs/pages/observed/gpu/) against today's rules: a rule change that contradicts a CUDA row
fails."""

from __future__ import annotations

from fsdp_matrix.cells import find_cell
from fsdp_matrix.device.observed import OBSERVED, rejudge
from fsdp_matrix.device.plan import _through_accelerate
from fsdp_matrix.matrix import DEFAULT_MATRIX, load_matrix

PASSING = {"reproduced", "fix-holds", "skipped"}


def test_every_kept_gpu_record_passes_under_todays_rules_but_the_layouts_faults():
    matrix = load_matrix(DEFAULT_MATRIX)
    judged = rejudge(sorted(OBSERVED.glob("*/call*/cells*.jsonl")), matrix)
    assert len(judged) >= 140  # 2026-11-28: 76 cells at world size 1, 73 at 2 on one GPU
    failing = [j for j in judged if j.verdict not in PASSING]
    # the only ones left: 2 ranks on one GPU through accelerate's save_state or the Trainer, which put rank 1 on
    # cuda:1 (the plan leaves them out since)
    for j in failing:
        cell = find_cell(matrix, j.key, "cuda")
        assert cell.world_size == 2 and _through_accelerate(cell), (j.key, j.verdict, j.line)


def test_rejudge_fails_a_record_whose_rule_now_says_otherwise(tmp_path):
    matrix = load_matrix(DEFAULT_MATRIX)
    source = next(OBSERVED.glob("*/call1/cells-gpu-image.jsonl"))
    line = next(t for t in source.read_text().splitlines() if '"fsdp2-4bit-forward"' in t)
    # the same observation (ok) at world size 2, where the report's rule (an error) decides the cell
    moved = line.replace("-ws1", "-ws2")
    (tmp_path / "cells.jsonl").write_text(moved + "\n")
    [j] = rejudge([tmp_path / "cells.jsonl"], matrix)
    assert j.verdict == "UNEXPECTED-FIX"
