"""DoRA under FSDP1 with PEFT's wrap policy and ``use_orig_params=True``: DoRA reads a sharded weight's shape.

https://github.com/huggingface/peft/issues/1984. PEFT's policy makes ``lora_A`` its own FSDP unit, so outside that
unit's forward its weight is a 1-D shard, and DoRA's ``torch.eye(lora_A.weight.shape[1])`` raises
``IndexError: tuple index out of range``. Needs 2 ranks (at 1, FSDP1 does not shard). Workarounds:
``use_orig_params=False`` with PEFT's policy, or FSDP2.
"""

import torch
from peft import LoraConfig, get_peft_model
from peft.utils.other import fsdp_auto_wrap_policy
from torch.distributed.fsdp import FullyShardedDataParallel
from transformers import LlamaConfig, LlamaForCausalLM

from fsdp_matrix.export.train import train

CELLS = ("dora-fp32-orig1-peft_policy-llama-ws2",)
"""The matrix cells this script is checked against (tests/export)."""


def run(params, ctx):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4
    )
    dora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_dora=True, task_type="CAUSAL_LM")
    model = get_peft_model(LlamaForCausalLM(config).to(ctx.device), dora)
    # device_id: on CPU, FSDP1 refuses to start without it, before it ever auto-wraps
    model = FullyShardedDataParallel(
        model, auto_wrap_policy=fsdp_auto_wrap_policy(model), use_orig_params=bool(params["orig"]), device_id=ctx.device
    )
    return train(model, ctx.device)
