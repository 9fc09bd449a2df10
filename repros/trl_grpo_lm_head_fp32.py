"""TRL GRPO ``cast_lm_head_to_fp32=True`` under FSDP2: https://github.com/huggingface/trl/issues/4867"""

from __future__ import annotations

from fsdp_matrix.case import TARGET_MODULES, Failures, RankContext, base_model, flag, lora_config, main, trl_entry

CASE = "trl-grpo-lm-head-fp32"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    fp32_head = bool(flag(params, "fp32_head"))
    # lora_head: the LoRA also targets lm_head, which TRL >= 1.9 refuses together with the fp32 head (trl PR#6330)
    targets = [*TARGET_MODULES, "lm_head"] if flag(params, "lora_head") else None
    model = base_model(params, ctx)
    # TRL keeps this module object (``.float()`` casts in place; PR#6330 replaces only its ``forward``), so the hook
    # sees every logits it computes: GRPO's generation and the harness's forward check
    seen: set = set()
    model.lm_head.register_forward_hook(lambda _m, _i, out: seen.add(str(out.dtype)))
    checks = trl_entry(
        model, lora_config(target_modules=targets), params, ctx, trainer="grpo", cast_lm_head_to_fp32=fp32_head
    )
    checks["lm_head_output_dtypes"] = sorted(seen)
    failed = Failures()
    if fp32_head and seen != {"torch.float32"}:
        # the option's promise (ScaleRL): logits in fp32 whatever the mixed precision computes the rest in
        failed.append(f"cast_lm_head_to_fp32=True but lm_head's outputs were {sorted(seen)}, not only torch.float32")
    failed.raise_if_any()
    return checks


if __name__ == "__main__":
    main(run, CASE)
