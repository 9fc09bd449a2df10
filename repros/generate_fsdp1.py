"""generate() on an FSDP1-wrapped PEFT model: https://github.com/huggingface/transformers/issues/30228"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from fsdp_matrix.case import (
    RankContext,
    add_adapter,
    axis,
    base_model,
    check_same_tokens,
    greedy_generate,
    main,
    synthetic_batch,
    train_unsharded,
    wrap_cell_and_train,
)

CASE = "generate-fsdp1"
WORKAROUNDS = ("none", "summon_root", "summon_all")
PROMPT, STEPS = 6, 3


def _build(params: dict, ctx: RankContext) -> nn.Module:
    return add_adapter(base_model(params, ctx), "lora", ctx.seed, init_lora_weights=False)


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    workaround = axis(params, "workaround", tuple(WORKAROUNDS))
    axis(params, "wrap", ("decoder_layer", "peft_policy"))  # the case is about FSDP1
    batch = synthetic_batch(ctx)
    prompt = batch[:, :PROMPT]
    reference = _build(params, ctx)
    train_unsharded(reference, batch, STEPS)
    wrapped, checks = wrap_cell_and_train(_build(params, ctx), params, ctx, steps=STEPS)
    reference.eval()
    wrapped.eval()
    summon = FullyShardedDataParallel.summon_full_params(wrapped, writeback=False, recurse=workaround == "summon_all")
    with torch.no_grad():
        expected = greedy_generate(reference, prompt)
        with contextlib.nullcontext() if workaround == "none" else summon:
            # the PeftModel under the FSDP root, as a user reaches it (wrapped.module.generate)
            tokens = greedy_generate(wrapped.module, prompt)
    return check_same_tokens(checks, tokens, expected, PROMPT, f"generate under FSDP1 on rank {ctx.rank}")


if __name__ == "__main__":
    main(run, CASE)
