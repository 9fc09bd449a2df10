"""FSDP1 NO_SHARD + accelerate's fp32 upcast of low-precision trainable flat params: https://github.com/pytorch/pytorch/issues/151223"""

from __future__ import annotations

from unittest import mock

from fsdp_matrix.case import (
    RankContext,
    accelerate_setup,
    axis,
    main,
    peft_model,
    train_and_check,
    trainable_names,
)

CASE = "accelerate-no-shard-upcast"
SHARDS = {"full": "FULL_SHARD", "none": "NO_SHARD"}
AMPS = ("no", "bf16")


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    axis(params, "entry", ("accelerate",)), axis(params, "wrap", ("decoder_layer",))
    strategy = SHARDS[axis(params, "shard", tuple(SHARDS), default="full")]
    amp = axis(params, "amp", AMPS)
    model = peft_model(params, ctx)  # a bf16 base, adapters kept bf16 by the autocast axis
    trainable = trainable_names(model)
    # as an accelerate config sets it (fsdp_sharding_strategy); the plugin reads it in __post_init__
    with mock.patch.dict("os.environ", {"FSDP_SHARDING_STRATEGY": strategy}):
        with accelerate_setup(model, params, ctx, mixed_precision=amp) as setup:
            checks = setup.checks()
            flat = [str(m._flat_param.dtype) for m in _fsdp_modules(setup.model) if m._has_params]
            checks["sharding_strategy"] = str(setup.plugin.sharding_strategy)
            checks["flat_param_dtypes"] = sorted(set(flat))
            step = dict(optimizer=setup.optimizer, backward=setup.accelerator.backward)
            checks.update(train_and_check(setup.model, ctx, trainable=trainable, **step))
    return checks


def _fsdp_modules(model):
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel.fsdp_modules(model)


if __name__ == "__main__":
    main(run, CASE)
