"""Tests for fsdp_matrix.export.cli: which traced run an export keeps."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fsdp_matrix.export import cli
from fsdp_matrix.export.prune import Trace
from fsdp_matrix.export.script import prepare
from fsdp_matrix.matrix import DEFAULT_MATRIX, load_matrix

MATRIX = load_matrix()
CELL = "lora-requires-grad/lora-fp32-orig0-decoder_layer-llama-ws2"
RAISED = (
    "===== outcome: rank 0: ValueError: Must flatten tensors with uniform `requires_grad` when "
    "`use_orig_params=False` (raised in torch.distributed.fsdp._flat_param._validate_tensors_to_flatten)"
)
TRAINED = "===== outcome: every rank trained (checks off: RUN_CHECKS)"


@pytest.mark.parametrize("without_checks, runs, checks", [(RAISED, [False], False), (TRAINED, [False, True], True)])
def test_a_failure_is_kept_without_the_checks_only_when_that_run_reproduces(monkeypatch, without_checks, runs, checks):
    exp = prepare(MATRIX, CELL, "old", Path("/nonexistent"), DEFAULT_MATRIX.parent)
    assert exp.expected.kind == "error"
    seen = []

    def traced(text, world_size, device, python):
        on = "RUN_CHECKS = False" not in text
        seen.append(on)
        return Trace({1}, outcome=RAISED if on else without_checks)

    monkeypatch.setattr(cli, "trace_script", traced)
    trace = cli.trace_for(exp, "always", sys.executable)
    assert seen == runs and trace.checks is checks


def test_a_cell_expected_to_train_keeps_its_checks(monkeypatch):
    exp = prepare(MATRIX, "lora-requires-grad/lora-fp32-orig1-decoder_layer-llama-ws2", "old", Path("/x"), Path("."))
    assert exp.expected.kind == "ok"
    seen = []
    monkeypatch.setattr(cli, "trace_script", lambda text, *a: seen.append(text) or Trace({1}, outcome=TRAINED))
    assert cli.trace_for(exp, "always", sys.executable).checks
    assert len(seen) == 1 and "RUN_CHECKS = True" in seen[0]


def test_a_harness_check_inlined_into_the_script_counts_as_the_harness_module():
    from fsdp_matrix.export.verify import judge_outcome
    from fsdp_matrix.verdicts import Verdict

    exp = prepare(
        MATRIX,
        "checkpoint-roundtrip/lora-fp32-orig1-decoder_layer-llama-save_fsdp1_full-ws2",
        "current",
        Path("/x"),
        DEFAULT_MATRIX.parent,
    )
    assert exp.expected.module == "fsdp_matrix.workload.checkpoint"
    saved = "rank 0: CheckFailed: adapter_model.safetensors holds 0/8 adapter tensors (raised in {}.check_saved)"
    assert judge_outcome(saved.format("__main__"), exp.expected).verdict == Verdict.REPRODUCED
    assert judge_outcome(saved.format("__fsdp_matrix_trace__"), exp.expected).verdict == Verdict.REPRODUCED
    # an error of a library stays what it is
    assert judge_outcome(saved.format("torch.distributed"), exp.expected).verdict == Verdict.DIFFERENT_ERROR
