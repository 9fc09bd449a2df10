"""Activation checkpointing as users turn it on, through every entry (the ``ac`` axis):
https://github.com/huggingface/transformers/issues/42489, https://github.com/huggingface/peft/issues/1577

The cell's LoRA model is built and trained by the harness's recipe (``wrap_and_train``); the ``ac`` axis turns
checkpointing on the way the cell's entry lets its users do it (fsdp_matrix/workload/activation.py), and the
structural check judges which modules are checkpoint-wrapped or flagged (units.py). On top of every check of a cell,
this repro counts the attention forwards run inside a backward pass: a cell that asks checkpointing must recompute
each decoder layer once per step (0 for ``none``), else checkpointing was never on, whatever the flags say.
"""

from __future__ import annotations

from fsdp_matrix.case import (
    CheckFailed,
    RankContext,
    axis,
    count_attention_calls,
    decoder_layers,
    main,
    peft_model,
    wrap_and_train,
)

CASE = "ac-entries"
AC_VALUES = ("none", "fsdp", "hf_reentrant", "hf_nonreentrant")
STEPS = 3


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    ac = axis(params, "ac", AC_VALUES)
    model = peft_model(params, ctx)
    layers = len(decoder_layers(model))
    calls = count_attention_calls(model)
    checks = wrap_and_train(model, params, ctx)
    recomputed = calls.in_backward / (STEPS * layers)
    checks["attention_recomputed_per_layer_step"] = recomputed
    want = 0 if ac == "none" else 1
    if recomputed != want:
        raise CheckFailed(
            f"attention was recomputed in backward {recomputed} times per layer and step, expected {want} (ac {ac})"
        )
    return checks


if __name__ == "__main__":
    main(run, CASE)
