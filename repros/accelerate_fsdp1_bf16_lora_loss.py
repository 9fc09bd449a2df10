"""FSDP1 + LoRA through accelerate with bf16 mixed precision, use_orig_params=True: loss NaN: https://github.com/Lightricks/LTX-2/issues/114"""

from __future__ import annotations

import math

from fsdp_matrix.case import (
    CheckFailed,
    RankContext,
    accelerate_setup,
    axis,
    main,
    peft_model,
    train_and_check,
    trainable_names,
)

CASE = "accelerate-fsdp1-bf16-lora-loss"


def loss_falls(losses: list) -> None:
    """The value-level check LTX-2#114 lacked: every step's loss finite, and the last below the first (the same
    LoRA run under DDP trains, per the report). Raises CheckFailed with the losses."""
    if len(losses) < 2 or not all(math.isfinite(x) for x in losses):
        raise CheckFailed(f"loss not finite over {len(losses)} steps: {losses}")
    if not losses[-1] < losses[0]:
        raise CheckFailed(f"loss does not fall over {len(losses)} steps: {losses}")


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    axis(params, "entry", ("accelerate",)), axis(params, "wrap", ("decoder_layer",))
    model = peft_model(params, ctx)
    trainable = trainable_names(model)
    # LTX-2's accelerate config: FSDP1, TRANSFORMER_BASED_WRAP, use_orig_params, mixed_precision bf16 (the init
    # axis adds its cpu_ram_efficient_loading + sync_module_states)
    with accelerate_setup(model, params, ctx, mixed_precision="bf16") as setup:
        checks = setup.checks()
        step = dict(optimizer=setup.optimizer, backward=setup.accelerator.backward)
        checks.update(train_and_check(setup.model, ctx, trainable=trainable, **step))
    loss_falls(checks["losses"])
    return checks


if __name__ == "__main__":
    main(run, CASE)
