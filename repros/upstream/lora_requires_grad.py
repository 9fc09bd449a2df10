"""LoRA under FSDP1 with ``use_orig_params=False``: one unit holds frozen base weights and trainable LoRA weights.

https://github.com/huggingface/peft/issues/1702. A tiny random Llama, LoRA on q/v, FSDP1 wrapping each decoder
layer. FSDP raises ``ValueError: Must flatten tensors with uniform `requires_grad` when `use_orig_params=False```.
Fixes: ``use_orig_params=True``, ``peft.utils.other.fsdp_auto_wrap_policy(model)``, or FSDP2.
"""

import functools

import torch
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from fsdp_matrix.export.train import train

CELLS = ("lora-fp32-orig0-decoder_layer-llama-ws2",)
"""The matrix cells this script is checked against (tests/export)."""


def run(params, ctx):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4
    )
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(LlamaForCausalLM(config).to(ctx.device), lora)
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
    # device_id: on CPU, FSDP1 refuses to start without it, before it ever auto-wraps
    model = FullyShardedDataParallel(
        model, auto_wrap_policy=policy, use_orig_params=bool(params["orig"]), device_id=ctx.device
    )
    return train(model, ctx.device)
