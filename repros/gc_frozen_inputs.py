"""Reentrant gradient checkpointing with frozen inputs: https://github.com/huggingface/peft/issues/1577"""

from __future__ import annotations

from fsdp_matrix.case import (
    CheckFailed,
    RankContext,
    add_adapter,
    axis,
    base_model,
    count_attention_calls,
    decoder_layers,
    main,
    train_and_check,
    trainable_names,
    trainer_setup,
    trainer_train_and_check,
    wrap_cell,
)

CASE = "gc-frozen-inputs"
GC = {"hf_reentrant": True, "hf_nonreentrant": False}
INPUTS = ("peft", "manual", "none")
STEPS = 3


def _kwargs(gc: str) -> dict:
    return {"gradient_checkpointing_kwargs": {"use_reentrant": GC[gc]}}


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    gc, inputs = axis(params, "gc", tuple(GC)), axis(params, "inputs", tuple(INPUTS))
    entry = axis(params, "entry", ("torch", "trainer"), default="torch")
    if entry not in ("torch", "trainer"):
        raise ValueError(f"{CASE} runs through the torch or trainer entry, not {entry!r}")
    if entry == "trainer" and inputs == "peft":
        raise ValueError("through the Trainer, checkpointing is turned on by the Trainer, after PEFT: inputs peft")
    base = base_model(params, ctx)
    if inputs == "peft":
        base.gradient_checkpointing_enable(**_kwargs(gc))
    model = add_adapter(base, axis(params, "adapter", ("lora",)), ctx.seed)
    if inputs != "peft" and entry == "torch":
        model.gradient_checkpointing_enable(**_kwargs(gc))
    if inputs == "manual":
        model.enable_input_require_grads()
    layers = len(decoder_layers(model))
    calls = count_attention_calls(model)
    trainable = trainable_names(model)
    if entry == "trainer":
        with trainer_setup(model, params, ctx, gradient_checkpointing=True, **_kwargs(gc)) as trainer:
            checks = trainer_train_and_check(trainer, params, ctx, trainable)
    else:
        wrapped = wrap_cell(model, params, ctx)
        checks = train_and_check(wrapped, ctx, steps=STEPS, trainable=trainable)
    recomputed = calls.in_backward / (STEPS * layers)
    checks["attention_recomputed_per_layer_step"] = recomputed
    if recomputed != 1:
        raise CheckFailed(
            f"attention was recomputed in backward {recomputed} times per layer and step, expected 1 "
            f"(checkpointing {gc} was off)"
        )
    return checks


if __name__ == "__main__":
    main(run, CASE)
