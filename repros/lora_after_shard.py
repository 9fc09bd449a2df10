"""LoRA injected into a model that is already sharded: https://github.com/huggingface/peft/pull/3578"""

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
