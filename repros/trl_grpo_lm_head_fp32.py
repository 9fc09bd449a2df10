"""TRL GRPO ``cast_lm_head_to_fp32=True`` under FSDP2: https://github.com/huggingface/trl/issues/4867"""

from __future__ import annotations

from fsdp_matrix.case import TARGET_MODULES, RankContext, base_model, flag, lora_config, main, trl_entry

CASE = "trl-grpo-lm-head-fp32"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    # lora_head: the LoRA also targets lm_head, which TRL >= 1.9 refuses together with the fp32 head (trl PR#6330)
    targets = [*TARGET_MODULES, "lm_head"] if flag(params, "lora_head") else None
    model = base_model(params, ctx)
    return trl_entry(
        model,
        lora_config(target_modules=targets),
        params,
        ctx,
        trainer="grpo",
        cast_lm_head_to_fp32=bool(flag(params, "fp32_head")),
    )


if __name__ == "__main__":
    main(run, CASE)
