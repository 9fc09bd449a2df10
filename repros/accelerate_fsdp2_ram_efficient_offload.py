"""FSDP2 cpu_ram_efficient_loading + CPU offload through accelerate: https://github.com/huggingface/accelerate/pull/3910"""

from __future__ import annotations

from unittest import mock

from fsdp_matrix.case import RankContext, axis, flag, main, materialize_trainable, peft_model, wrap_and_train

CASE = "accelerate-fsdp2-ram-efficient-offload"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    axis(params, "entry", ("accelerate",)), axis(params, "wrap", ("fsdp2",))
    offload = flag(params, "offload")
    model = peft_model(params, ctx, autocast=False)
    # ram-efficient-untrained's fix (axolotl PR #3977), so that that case's failure cannot hide this one's
    materialized = materialize_trainable(model, ctx.device)
    # as an accelerate config sets it (fsdp_offload_params): the plugin reads it in __post_init__ and turns it into
    # FSDP2's CPUOffloadPolicy
    with mock.patch.dict("os.environ", {"FSDP_OFFLOAD_PARAMS": "true" if offload else "false"}):
        checks = wrap_and_train(model, params, ctx)
    return {"offload": offload, "materialized_modules": materialized, **checks}


if __name__ == "__main__":
    main(run, CASE)
