"""generate() on an FSDP1-wrapped PEFT model: https://github.com/huggingface/transformers/issues/30228"""

from __future__ import annotations

import contextlib

import torch
from peft import get_peft_model
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from fsdp_matrix.case import (
    RankContext,
    axis,
    base_model,
    check_same_tokens,
    flag,
    greedy_generate,
    lora_config,
    main,
    synthetic_batch,
    train_and_check,
    train_unsharded,
    trainable_names,
    wrap,
)

CASE = "generate-fsdp1"
WORKAROUNDS = ("none", "summon_root", "summon_all")
PROMPT, STEPS = 6, 3


def _build(params: dict, ctx: RankContext) -> nn.Module:
    model = base_model(params, ctx)
    torch.manual_seed(ctx.seed)
    return get_peft_model(model, lora_config(init_lora_weights=False))


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    workaround = axis(params, "workaround", tuple(WORKAROUNDS))
    batch = synthetic_batch(ctx)
    prompt = batch[:, :PROMPT]
    reference = _build(params, ctx)
    model = _build(params, ctx)
    trainable = trainable_names(model)
    how = axis(params, "wrap", ("decoder_layer", "peft_policy"))
    wrapped = wrap(model, how, flag(params, "orig"), ctx)
    if not isinstance(wrapped, FullyShardedDataParallel):
        raise ValueError(f"{CASE} is about FSDP1: wrap decoder_layer or peft_policy, not {how!r}")
    train_unsharded(reference, batch, STEPS)
    checks = train_and_check(wrapped, ctx, steps=STEPS, trainable=trainable)
    reference.eval()
    wrapped.eval()
    if workaround == "none":
        gathered = contextlib.nullcontext()
    else:
        gathered = FullyShardedDataParallel.summon_full_params(
            wrapped, writeback=False, recurse=workaround == "summon_all"
        )
    with torch.no_grad():
        expected = greedy_generate(reference, prompt)
        with gathered:
            # the PeftModel under the FSDP root, as a user reaches it (wrapped.module.generate)
            tokens = greedy_generate(wrapped.module, prompt)
    return check_same_tokens(checks, tokens, expected, PROMPT, f"generate under FSDP1 on rank {ctx.rank}")


if __name__ == "__main__":
    main(run, CASE)
