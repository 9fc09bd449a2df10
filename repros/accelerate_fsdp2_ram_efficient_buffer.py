"""FSDP2 cpu_ram_efficient_loading on a model with a persistent buffer: https://github.com/huggingface/accelerate/issues/3898"""

from __future__ import annotations

import torch
from accelerate import init_empty_weights
from torch import nn

from fsdp_matrix.case import (
    TINY_SHAPE,
    RankContext,
    add_adapter,
    axis,
    init_of,
    main,
    save_model_files,
    save_once,
    wrap_and_train,
)

CASE = "accelerate-fsdp2-ram-efficient-buffer"
# the MoE router of DeepSeek V3 keeps e_score_correction_bias as a persistent buffer (in model.state_dict())
_SHAPE = dict(
    TINY_SHAPE,
    q_lora_rank=16,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=16,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=0,
    moe_intermediate_size=32,
)
TARGETS = ["q_b_proj", "o_proj"]
"""DeepSeek V3's attention has no q_proj/v_proj with a q_lora_rank (transformers 4.51.3 always builds q_a/q_b_proj)."""


def _build(ctx: RankContext, on_meta: bool) -> nn.Module:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM  # ImportError where transformers lacks it

    torch.manual_seed(ctx.seed)
    config = DeepseekV3Config(**_SHAPE)
    if on_meta:
        with init_empty_weights():
            return DeepseekV3ForCausalLM(config)
    return DeepseekV3ForCausalLM(config).to(ctx.device)


def deepseek_base(params: dict, ctx: RankContext) -> nn.Module:
    """The tiny DeepSeek V3: built on every rank (``init: full``), or saved once and loaded by rank 0 alone while
    ranks > 0 hold it on meta (``init: ram_efficient``, what accelerate's ram-efficient loading expects)."""
    if init_of(params) == "full":
        return _build(ctx, on_meta=False)
    path = save_once(ctx, f"deepseek_v3-seed{ctx.seed}", lambda p: save_model_files(_build(ctx, False), p))
    if not ctx.is_main:
        return _build(ctx, on_meta=True)
    from transformers import DeepseekV3ForCausalLM

    return DeepseekV3ForCausalLM.from_pretrained(path, low_cpu_mem_usage=True).to(ctx.device)


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    axis(params, "adapter", ("lora",)), axis(params, "arch", ("deepseek_v3",))
    base = deepseek_base(params, ctx)
    buffers = [n for n, _ in base.named_buffers() if n in base.state_dict()]
    model = add_adapter(base, "lora", ctx.seed, target_modules=TARGETS)
    return {"persistent_buffers": len(buffers), **wrap_and_train(model, params, ctx)}


if __name__ == "__main__":
    main(run, CASE)
