"""merge_and_unload on a LoRA model inside FSDP: https://github.com/axolotl-ai-cloud/axolotl/issues/3294"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from fsdp_matrix.case import (
    DTensor,
    Failures,
    RankContext,
    axis,
    main,
    peft_model,
    synthetic_batch,
    train_and_check,
    trainable_names,
    wrap_cell,
)

CASE = "merge-under-fsdp"

ATOL = 1e-4
"""Merging is exact up to float rounding: observed max |diff| 2.1e-7 where it works, 0.5 and more where it does not."""


def _logits(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=batch).logits.detach().float().cpu()


def _shape(weight: torch.Tensor) -> str:
    if isinstance(weight, DTensor):
        return f"DTensor {list(weight.shape)} (local {list(weight.to_local().shape)})"
    return f"{type(weight).__name__} {list(weight.shape)}"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    params = {"adapter": "lora", **params}
    model = peft_model(params, ctx)
    full = list(model.get_submodule("base_model.model.model.layers.0.self_attn.q_proj").weight.shape)
    trainable = trainable_names(model)
    wrapped = wrap_cell(model, params, ctx)
    checks = train_and_check(wrapped, ctx, trainable=trainable)
    batch = synthetic_batch(ctx)
    before = _logits(wrapped, batch)
    inner = wrapped.module if isinstance(wrapped, FullyShardedDataParallel) else wrapped
    if axis(params, "gather", ("none", "summon")) == "summon":
        scope = FullyShardedDataParallel.summon_full_params(wrapped, writeback=True)
    else:
        scope = contextlib.nullcontext()
    with scope:
        merged = inner.merge_and_unload()
    q_proj = merged.get_submodule("model.layers.0.self_attn.q_proj")
    after = _logits(wrapped, batch)
    diff = float((after - before).abs().max())
    checks.update(
        merged_q_proj=f"{type(q_proj).__name__}, weight {_shape(q_proj.weight)}",
        lora_modules_left=sum("lora_" in n for n, _ in merged.named_modules()),
        merge_max_diff=diff,
    )
    failed = Failures()
    if checks["lora_modules_left"]:
        failed.append(f"{checks['lora_modules_left']} LoRA modules left after merge_and_unload")
    if not diff <= ATOL:
        failed.append(
            f"merging changed the wrapped model's logits by max |diff| {diff:.3g} (atol {ATOL:g}); merged q_proj "
            f"weight is {_shape(q_proj.weight)}, full shape {full}"
        )
    failed.raise_if_any()
    return checks


if __name__ == "__main__":
    main(run, CASE)
