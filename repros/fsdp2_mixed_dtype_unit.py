"""An FSDP2 unit whose parameters have different dtypes: https://github.com/pytorch/pytorch/pull/154103"""

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
