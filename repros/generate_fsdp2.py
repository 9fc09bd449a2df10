"""generate() on a fully_shard-ed PEFT model: https://github.com/huggingface/transformers/issues/42417"""

from __future__ import annotations

import torch
from torch import nn

from fsdp_matrix.case import (
    RankContext,
    add_adapter,
    axis,
    base_model,
    check_same_tokens,
    fsdp2,
    greedy_generate,
    main,
    synthetic_batch,
    train_and_check,
    train_unsharded,
    trainable_names,
)

try:
    from torch.distributed.fsdp import register_fsdp_forward_method
except ImportError:  # torch < 2.6 has FSDP2 only under _composable
    from torch.distributed._composable.fsdp import register_fsdp_forward_method

CASE = "generate-fsdp2"
PROMPT, STEPS = 6, 3


def _build(params: dict, ctx: RankContext) -> nn.Module:
    model = base_model(params, ctx)
    if axis(params, "adapter", ("lora", "none")) == "none":
        return model
    return add_adapter(model, "lora", ctx.seed, init_lora_weights=False)


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    state = axis(params, "state", ("fresh", "trained", "after_forward"))
    batch = synthetic_batch(ctx)
    prompt = batch[:, :PROMPT]
    reference = _build(params, ctx)
    model = _build(params, ctx)
    trainable = trainable_names(model) if axis(params, "adapter", ("lora", "none")) != "none" else None
    fsdp2(model, ctx)
    if axis(params, "workaround", ("none", "register")) == "register":
        register_fsdp_forward_method(model, "generate")
    checks = {}
    if state == "trained":
        train_unsharded(reference, batch, STEPS)
        checks = train_and_check(model, ctx, steps=STEPS, trainable=trainable)
    reference.eval()
    model.eval()
    with torch.no_grad():
        if state == "after_forward":
            model(input_ids=batch)
        expected = greedy_generate(reference, prompt)
        checks["param_types_before_generate"] = sorted({type(p).__name__ for p in model.parameters()})
        tokens = greedy_generate(model, prompt)
    return check_same_tokens(checks, tokens, expected, PROMPT, "generate under FSDP2")


if __name__ == "__main__":
    main(run, CASE)
