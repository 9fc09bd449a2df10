"""Tests for fsdp_matrix.export.cli: what an export writes, and how a run's outcome line is judged."""

from __future__ import annotations

from pathlib import Path

from fsdp_matrix.export import cli
from fsdp_matrix.export.script import prepare
from fsdp_matrix.export.verify import judge_outcome
from fsdp_matrix.matrix import DEFAULT_MATRIX, load_matrix
from fsdp_matrix.verdicts import Verdict

MATRIX = load_matrix()
CELL = "lora-requires-grad/lora-fp32-orig0-decoder_layer-llama-ws2"


def test_an_original_is_written_from_its_upstream_script_and_older_flags_still_parse(tmp_path, capsys):
    argv = [CELL, "--combo", "old", "--out", str(tmp_path), "--results", str(tmp_path / "none")]
    assert cli.main(argv + ["--trace", "never", "--python", "python3"]) == 0
    script, snippet = (Path(p) for p in capsys.readouterr().out.split())
    assert script.suffix == ".py" and snippet.suffix == ".md"
    text = script.read_text()
    assert "from the hand-written upstream script (lora_requires_grad.py)" in text
    assert 'use_orig_params=bool(params["orig"])' in text and "PARAMS = {" in text


def test_a_harness_check_inlined_into_the_script_counts_as_the_harness_module():
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
    # an error of a library stays what it is
    assert judge_outcome(saved.format("torch.distributed"), exp.expected).verdict == Verdict.DIFFERENT_ERROR


def test_the_warning_a_rule_names_before_its_error_is_read_from_what_the_ranks_printed():
    """no-grad-fn's runs warn first (torch's reentrant checkpoint): an exported script's run judged without the
    warnings it printed was DIFFERENT-ERROR (seen failing before: tests/export/test_verify.py's heavy survey of
    gc-frozen-inputs)."""
    from fsdp_matrix.export.verify import Alone, printed_warnings

    exp = prepare(
        MATRIX,
        "gc-frozen-inputs/lora-fp32-orig1-decoder_layer-llama-gc_hf_reentrant-inputs_none-ws2",
        "old",
        Path("/x"),
        DEFAULT_MATRIX.parent,
    )
    warned = (
        "/env/lib/python3.11/site-packages/torch/utils/checkpoint.py:238: UserWarning: None of the inputs have "
        "requires_grad=True. Gradients will be None\n  return fn(*args, **kwargs)\n"
    )
    assert printed_warnings(warned) == [
        {"category": "UserWarning", "message": "None of the inputs have requires_grad=True. Gradients will be None"}
    ]
    outcome = (
        "rank 0: RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn "
        "(raised in torch.autograd.graph._engine_run_backward)"
    )
    stdout = f"===== outcome: {outcome}\n"
    assert Alone(1, warned + stdout, [], stdout).judge(exp.expected).verdict == Verdict.REPRODUCED
    assert Alone(1, stdout, [], stdout).judge(exp.expected).verdict == Verdict.DIFFERENT_ERROR
