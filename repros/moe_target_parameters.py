"""LoRA on MoE expert parameters under FSDP1: https://github.com/huggingface/peft/issues/3080"""

from __future__ import annotations

import torch
import transformers
from peft import get_peft_model
from torch import nn

from fsdp_matrix.case import TINY_SHAPE, RankContext, axis, lora_config, main, wrap_and_train

CASE = "moe-target-parameters"
EXPERTS = 4
TARGET_PARAMETERS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]

_MOE_SHAPE = dict(TINY_SHAPE, num_local_experts=EXPERTS, num_experts_per_tok=2)


def build_moe(ctx: RankContext) -> nn.Module:
    """A random-init MoE causal LM whose experts are 3-D ``nn.Parameter``s, identical on every rank."""
    torch.manual_seed(ctx.seed)
    if int(transformers.__version__.split(".")[0]) >= 5:
        from transformers import MixtralConfig, MixtralForCausalLM

        model = MixtralForCausalLM(MixtralConfig(**_MOE_SHAPE))
    else:
        # ImportError before transformers 4.55, which has no GPT-OSS
        from transformers import GptOssConfig, GptOssForCausalLM

        model = GptOssForCausalLM(GptOssConfig(head_dim=16, sliding_window=16, **_MOE_SHAPE))
    return model.to(ctx.device)


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    axis(params, "model", ("moe",)), axis(params, "adapter", ("lora_params",))
    # TypeError before PEFT 0.17.0, whose LoraConfig has no target_parameters
    config = lora_config(target_modules=[], task_type=None, target_parameters=TARGET_PARAMETERS)
    base = build_moe(ctx)
    torch.manual_seed(ctx.seed)
    model = get_peft_model(base, config)
    return wrap_and_train(model, params, ctx)


if __name__ == "__main__":
    main(run, CASE)
