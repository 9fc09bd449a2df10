"""Adapter checkpoints saved under FSDP by each path users use: https://github.com/huggingface/accelerate/pull/4206"""

from __future__ import annotations

from fsdp_matrix.case import (
    DTYPES,
    HF_SAVES,
    RAW_PATHS,
    RankContext,
    adapter_dtypes,
    axis,
    base_dtype_name,
    base_model,
    cell_dir,
    full_shapes,
    has_autocast_option,
    hf_roundtrip,
    main,
    peft_model,
    raw_roundtrip,
    torch_dtype,
    train_and_check,
    wrap_cell,
)

CASE = "checkpoint-roundtrip"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    save, dtype = axis(params, "save", (*HF_SAVES, *RAW_PATHS)), axis(params, "dtype", tuple(DTYPES), default="fp32")
    # half-precision cells keep the adapter in the base dtype, so FSDP1 units stay uniform (peft#2129 is another case)
    autocast = False if dtype != "fp32" and has_autocast_option() else None

    def build_peft():
        return peft_model(params, ctx, autocast=autocast)

    model = build_peft()
    if adapter_dtypes(model) != [base_dtype_name(params)]:
        raise RuntimeError(f"adapters are {adapter_dtypes(model)}, not {base_dtype_name(params)}")
    expected = full_shapes(model)
    builders = (lambda: base_model(params, ctx), build_peft)
    with cell_dir(ctx, params) as out:
        if save in HF_SAVES:
            del model  # accelerate and the Trainer wrap and train a model of their own
            return {"save": save, **hf_roundtrip(save, params, ctx, out, builders, expected, torch_dtype(dtype))}
        wrapped = wrap_cell(model, params, ctx)
        checks = train_and_check(wrapped, ctx)
        return {
            "save": save,
            **checks,
            **raw_roundtrip(save, wrapped, ctx, out, builders, expected, torch_dtype(dtype)),
        }


if __name__ == "__main__":
    main(run, CASE)
