"""LoRA injected into a model that is already sharded (get_peft_model after FSDP wrapping).

Upstream: huggingface/peft PR #3578 ("Fix LoRA on FSDP2-sharded models: shape inference and module hooks"),
reported from transformers' DistributedConfig(fsdp_size=...), which shards inside from_pretrained
(huggingface/transformers#48204), so that get_peft_model only ever sees sharded weights. Under FSDP2 PEFT read
the local Shard(0) shape of the base weight and built lora_B with out_features / world_size, and the forward
failed with "The size of tensor a (...) must match the size of tensor b (...)".

The same user order (shard first, then add the adapter) is run with FSDP1 (`wrap: decoder_layer`, both
`use_orig_params`) and FSDP2 (`wrap: fsdp2`), then 3 training steps and the usual checks.

    torchrun --nproc-per-node 2 repros/lora_after_shard.py --cell lora-fp32-fsdp2-llama-ws2
"""

from __future__ import annotations

import sys

import torch
from peft import get_peft_model

from fsdp_matrix.case import (
    RankContext,
    axis,
    build_model,
    flag,
    lora_config,
    main,
    train_and_check,
    trainable_names,
    wrap,
)

CASE = "lora-after-shard"

WRAPS_HANDLED = ("decoder_layer", "fsdp2")


def run(params, ctx: RankContext) -> dict:
    wrap_kind = axis(params, "wrap", WRAPS_HANDLED)
    orig = flag(params, "orig", default=None)
    model = build_model(axis(params, "model", ("llama",)), axis(params, "dtype", ("fp32",)), ctx)
    # The report's order: the base model is sharded first ...
    sharded = wrap(model, wrap_kind, orig, ctx)
    # ... and only then gets its adapter, with the same init on every rank.
    torch.manual_seed(ctx.seed)
    peft = get_peft_model(sharded, lora_config())
    # get_peft_model injects the LoRA layers in place, inside the FSDP root; the PeftModel around it only
    # forwards to it. The FSDP root is what is trained and checked (train_and_check requires its model to be
    # the FSDP wrapper itself, and an FSDP1 root inside a PeftModel is not).
    root = peft.get_base_model()
    names = trainable_names(root)
    return train_and_check(root, ctx, trainable=names)


if __name__ == "__main__":
    sys.exit(main(run, CASE))
