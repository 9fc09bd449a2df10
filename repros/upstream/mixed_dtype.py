"""LoRA on a bf16 base under FSDP1: PEFT upcasts the adapters to fp32, and one FSDP unit holds both dtypes.

https://github.com/huggingface/peft/issues/2129. ``get_peft_model(..., autocast_adapter_dtype=True)`` (PEFT's
default since 0.12.0) makes the LoRA weights fp32 beside the bf16 base weights of the same decoder layer, and FSDP1
raises ``ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.float32`` (with
``use_orig_params=True`` too). Fixes: ``autocast_adapter_dtype=False``, PEFT's wrap policy, or FSDP2.
"""

import functools

import torch
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from fsdp_matrix.export.train import train

CELLS = ("lora-bf16-orig1-decoder_layer-llama-autocast1-ws2",)
"""The matrix cells this script is checked against (tests/export)."""


def run(params, ctx):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4
    )
    base = LlamaForCausalLM(config).to(device=ctx.device, dtype=torch.bfloat16)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(base, lora, autocast_adapter_dtype=bool(params["autocast"]))
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
    # device_id: on CPU, FSDP1 refuses to start without it, before it ever auto-wraps
    model = FullyShardedDataParallel(
        model, auto_wrap_policy=policy, use_orig_params=bool(params["orig"]), device_id=ctx.device
    )
    return train(model, ctx.device)
