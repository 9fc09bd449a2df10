"""FSDP2 MixedPrecisionPolicy with non-reentrant checkpointing: https://github.com/pytorch/pytorch/issues/159359"""

from __future__ import annotations

import torch

from fsdp_matrix.case import (
    CheckFailed,
    RankContext,
    add_adapter,
    axis,
    base_model,
    count_attention_calls,
    decoder_layers,
    device_mesh,
    fully_shard,
    main,
    train_and_check,
    trainable_names,
)

CASE = "fsdp2-mp-checkpoint-recompute"
GC = ("none", "hf_nonreentrant")
MPP = ("none", "bf16")


def _policy(mpp: str):
    if mpp == "none":
        return {}
    from torch.distributed.fsdp import MixedPrecisionPolicy

    # NVIDIA-NeMo/Automodel#3504's policy: bf16 compute over fp32 master weights, fp32 reduce and outputs
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32)
    return {"mp_policy": policy}


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    gc, mpp = axis(params, "gc", GC), axis(params, "mpp", MPP)
    axis(params, "wrap", ("fsdp2",)), axis(params, "dtype", ("fp32",))
    base = base_model(params, ctx)  # fp32 master weights
    if gc != "none":
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = add_adapter(base, axis(params, "adapter", ("lora",)), ctx.seed)
    trainable = trainable_names(model)
    calls = count_attention_calls(model)
    mesh, kwargs = device_mesh(ctx), _policy(mpp)
    # each decoder layer, the head and the root, as Automodel's FSDP2 strategy shards them: with output_dtype fp32
    # the last layer hands fp32 to the final norm, and the head needs its own unit to cast that back to bf16
    for module in [*decoder_layers(model), model.get_base_model().get_output_embeddings()]:
        fully_shard(module, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    checks = train_and_check(model, ctx, trainable=trainable)
    if gc != "none" and calls.in_backward == 0:
        raise CheckFailed("checkpointing was asked for, but no decoder layer was recomputed in backward")
    return {"recomputed_attention_calls": calls.in_backward, **checks}


if __name__ == "__main__":
    main(run, CASE)
