"""pytorch PR #154103 / accelerate#3985: an FSDP2 ``fully_shard`` unit whose parameters have different dtypes.

FSDP2 checks at its lazy init that one unit's parameters share their original dtype: ``AssertionError: FSDP expects
uniform original parameter dtype but got {torch.bfloat16, torch.float32}``. Up to torch 2.7 it checks every
parameter, so a bf16 frozen base with PEFT's fp32-upcast LoRA (``autocast_adapter_dtype=True``, the default) in one
unit raises. From torch 2.8 (PR #154103) it checks the trainable ones only, so that trains, but trainable bf16 next
to trainable fp32 in one unit still raises (pytorch#156784): here a bf16 ``modules_to_save`` copy of ``lm_head``
and the fp32 LoRA, both in the root unit. accelerate 1.14.0 (PR #3985) upcasts the trainable parameters before
``fully_shard`` when mixed precision is on.

Axes: ``autocast`` 1/0; ``mts`` none / lm_head (``modules_to_save=["lm_head"]``); ``wrap`` fsdp2 (per decoder
layer, then the root: the lm_head copy is in the root unit, the LoRA weights in the layer units) / fsdp2_root (only
the root: everything in one unit). A fix holds when training passes every check and the frozen base stayed bf16.
"""

from __future__ import annotations

import torch
from peft import get_peft_model
from torch.distributed.device_mesh import init_device_mesh

from fsdp_matrix.case import (
    CheckFailed,
    RankContext,
    axis,
    base_dtype_name,
    base_model,
    flag,
    fsdp2,
    fully_shard,
    has_autocast_option,
    lora_config,
    main,
    train_and_check,
    trainable_names,
)

CASE = "fsdp2-mixed-dtype-unit"


def _dtypes(model: torch.nn.Module, trainable: bool) -> list:
    return sorted({str(p.dtype) for p in model.parameters() if p.requires_grad == trainable})


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    base = base_model(params, ctx)
    config = lora_config(modules_to_save=["lm_head"] if axis(params, "mts", ("none", "lm_head")) == "lm_head" else None)
    autocast = flag(params, "autocast")
    # asking for the upcast on a PEFT without the option raises TypeError, as PEFT does; no upcast is what it did
    kwargs = {"autocast_adapter_dtype": autocast} if autocast or has_autocast_option() else {}
    torch.manual_seed(ctx.seed)
    model = get_peft_model(base, config, **kwargs)
    built = {"trainable_dtypes": _dtypes(model, True), "frozen_dtypes": _dtypes(model, False)}
    trainable = trainable_names(model)
    kind = axis(params, "wrap", ("fsdp2", "fsdp2_root"))
    if kind == "fsdp2":
        fsdp2(model, ctx)
    else:
        fully_shard(model, mesh=init_device_mesh(ctx.device.type, (ctx.world_size,)))
    checks = {**built, **train_and_check(model, ctx, trainable=trainable)}
    checks["frozen_dtypes_after"] = _dtypes(model, False)
    want = [base_dtype_name(params)]
    if checks["frozen_dtypes_after"] != want:
        raise CheckFailed(f"frozen parameters ended up {checks['frozen_dtypes_after']}, not {want}")
    return checks


if __name__ == "__main__":
    main(run, CASE)
