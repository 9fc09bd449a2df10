"""FSDP1 bf16 mixed precision through TRL: https://github.com/huggingface/transformers/issues/34702"""

from __future__ import annotations

from fsdp_matrix.case import RankContext, axis, build_4bit_model, build_model, lora_config, main, trl_entry

CASE = "fsdp1-mp-optimizer-dtype"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    model, dtype = axis(params, "model", ("llama",)), axis(params, "dtype", ("bf16",))
    if axis(params, "adapter", ("lora", "qlora")) == "qlora":
        base = build_4bit_model(model, dtype, axis(params, "storage", ("bf16",)), ctx)
    else:
        base = build_model(model, dtype, ctx)
    # the report's optimizer: transformers' default before adamw_torch_fused became it
    return trl_entry(base, lora_config(), params, ctx, optim="adamw_torch")


if __name__ == "__main__":
    main(run, CASE)
