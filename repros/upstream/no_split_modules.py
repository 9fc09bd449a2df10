"""``peft.utils.other.fsdp_auto_wrap_policy`` on a model without ``_no_split_modules``.

https://github.com/huggingface/peft/issues/2166. With ``FSDP_TRANSFORMER_CLS_TO_WRAP`` unset, ``"".split(",")``
gives ``[""]``, the class lookup for ``""`` fails, and the policy raises ``Could not find the transformer layer class
to wrap in the model.`` Fixed in PEFT 0.14.0 (https://github.com/huggingface/peft/pull/2167): the policy comes
back, and the model trains under FSDP1 with it.
"""

import os

import torch
from peft import LoraConfig, get_peft_model
from peft.utils.other import fsdp_auto_wrap_policy
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from transformers.modeling_outputs import CausalLMOutput

from fsdp_matrix.export.train import train

CELLS = ("lora-orig0-cls_env_unset-shape_plain-ws2",)
"""The matrix cells this script is checked against (tests/export)."""


class PlainNet(nn.Module):
    """A plain module: no ``_no_split_modules`` attribute at all."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(128, 64), nn.Linear(64, 128)
        self.q_proj, self.v_proj = nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, input_ids, labels=None, **unused):
        logits = self.head(self.v_proj(torch.relu(self.q_proj(self.embed(input_ids)))))
        loss = nn.functional.cross_entropy(logits.reshape(-1, 128), labels.reshape(-1))
        return CausalLMOutput(loss=loss, logits=logits)  # FSDP1 hooks its backward on the tensors it finds here


def run(params, ctx):
    torch.manual_seed(0)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(PlainNet().to(ctx.device), lora)
    os.environ.pop("FSDP_TRANSFORMER_CLS_TO_WRAP", None)
    policy = fsdp_auto_wrap_policy(model)
    model = FullyShardedDataParallel(
        model, auto_wrap_policy=policy, use_orig_params=bool(params["orig"]), device_id=ctx.device
    )
    return train(model, ctx.device)
