"""``merge_and_unload`` on a LoRA model while it is FSDP-wrapped (axolotl#3294, torchtune PR #506, unsloth#409).

Users merge the adapter into the base weights at the end of an FSDP run, on the PEFT model inside the wrapper.
Outside a unit's forward, FSDP1 (``use_orig_params=True``) exposes each weight as this rank's 1-D slice of the flat
parameter: PEFT then merges ``lora_B.weight @ lora_A.weight`` computed from 1-D slices into the 1-D base slice, and
nothing raises (observed). The fix users are given (torchtune PR #506) is to merge inside
``FSDP.summon_full_params(model, writeback=True)``. FSDP2 keeps DTensors, on which the merge is done per shard.

The cell: 3 training steps (the usual checks), the wrapped model's logits on a fixed batch, ``merge_and_unload()`` on
the inner PEFT model (``gather``: ``none``, or ``summon`` = inside ``summon_full_params(writeback=True)``), then the
logits of the same wrapped model again. Merging must not change the output: CheckFailed gives the difference and
the merged ``q_proj`` weight's shape.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from fsdp_matrix.workload.checks import DTensor, Failures, trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.params import axis, flag
from fsdp_matrix.workload.recipe import peft_model
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import WRAPS, wrap

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
    wrapped = wrap(model, axis(params, "wrap", WRAPS), flag(params, "orig", default=None), ctx)
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
    from fsdp_matrix.standalone import main

    main(run, CASE)
