"""LoRA under FSDP1 with use_orig_params=False: https://github.com/huggingface/peft/issues/1702"""

from __future__ import annotations

from fsdp_matrix.case import (
    DTYPES,
    RankContext,
    adapter_dtypes,
    axis,
    base_dtype_name,
    has_autocast_option,
    main,
    peft_model,
    wrap_and_train,
)

CASE = "lora-requires-grad"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    keep = axis(params, "dtype", tuple(DTYPES), default="fp32") != "fp32"
    # PEFT releases without autocast_adapter_dtype leave adapters in the base dtype on their own
    model = peft_model(params, ctx, autocast=False if keep and has_autocast_option() else None)
    if keep and adapter_dtypes(model) != [base_dtype_name(params)]:
        raise RuntimeError(
            f"adapters are {adapter_dtypes(model)}, not {base_dtype_name(params)}: this cell would "
            "test the dtype check, not the requires_grad one"
        )
    return wrap_and_train(model, params, ctx)


if __name__ == "__main__":
    main(run, CASE)
