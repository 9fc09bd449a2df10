"""An FSDP2 unit whose parameters have different dtypes: https://github.com/pytorch/pytorch/pull/154103"""

from __future__ import annotations

import torch

from fsdp_matrix.case import (
    CheckFailed,
    RankContext,
    add_adapter,
    axis,
    base_dtype_name,
    base_model,
    flag,
    fsdp2,
    main,
    train_and_check,
    trainable_names,
)

CASE = "fsdp2-mixed-dtype-unit"


def _dtypes(model: torch.nn.Module, trainable: bool) -> list:
    return sorted({str(p.dtype) for p in model.parameters() if p.requires_grad == trainable})


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    mts = ["lm_head"] if axis(params, "mts", ("none", "lm_head")) == "lm_head" else None
    # asking for the upcast on a PEFT without the option raises TypeError, as PEFT does; no upcast is what it did
    model = add_adapter(
        base_model(params, ctx), "lora", ctx.seed, autocast=flag(params, "autocast"), modules_to_save=mts
    )
    built = {"trainable_dtypes": _dtypes(model, True), "frozen_dtypes": _dtypes(model, False)}
    trainable = trainable_names(model)
    fsdp2(model, ctx, per_layer=axis(params, "wrap", ("fsdp2", "fsdp2_root")) == "fsdp2")
    checks = {**built, **train_and_check(model, ctx, trainable=trainable)}
    checks["frozen_dtypes_after"] = _dtypes(model, False)
    want = [base_dtype_name(params)]
    if checks["frozen_dtypes_after"] != want:
        raise CheckFailed(f"frozen parameters ended up {checks['frozen_dtypes_after']}, not {want}")
    return checks


if __name__ == "__main__":
    main(run, CASE)
