"""LoRA with modules_to_save=["lm_head"] under FSDP: https://github.com/huggingface/peft/pull/2681"""

from __future__ import annotations

import torch
from peft import get_peft_model

from fsdp_matrix.case import RankContext, base_model, lora_config, main, wrap_and_train

CASE = "modules-to-save"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    base = base_model(params, ctx)
    config = lora_config(modules_to_save=["lm_head"])
    torch.manual_seed(ctx.seed)  # the same adapter on every rank
    return wrap_and_train(get_peft_model(base, config), params, ctx)


if __name__ == "__main__":
    main(run, CASE)
