"""Tiny models without ``_no_split_modules``: a plain ``nn.Module`` and a transformers model whose attribute is None.

Both have ``q_proj``/``v_proj`` linears, so the same LoRA target modules apply, and both return a ``CausalLMOutput``
with a ``loss`` for ``(input_ids, labels)``, so the same training loop trains them.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.models import VOCAB

HIDDEN = 64


class _Layers(nn.Module):
    """Embedding -> q_proj -> v_proj -> head, and a causal-LM-style loss (without the shift: not needed here)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.q_proj = nn.Linear(HIDDEN, HIDDEN)
        self.v_proj = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor = None, **unused) -> CausalLMOutput:
        # ``unused``: what a Trainer's PEFT model passes along (attention_mask, ...), as a transformers model takes it
        # the output must be a type FSDP1 looks into (ModelOutput is a dict): it hooks the root's backward on the
        # tensors it finds there, and without that hook no unit is reset after backward
        logits = self.head(F.gelu(self.v_proj(F.gelu(self.q_proj(self.embed(input_ids))))))
        loss = None if labels is None else F.cross_entropy(logits.reshape(-1, VOCAB).float(), labels.reshape(-1))
        return CausalLMOutput(loss=loss, logits=logits)


class PlainNet(_Layers):
    """A plain ``nn.Module``: no ``_no_split_modules`` attribute at all."""


class TinyHFConfig(PretrainedConfig):
    """Config of TinyHFModel; nothing to configure."""

    model_type = "fsdp-matrix-tiny"


class TinyHFModel(PreTrainedModel):
    """A transformers model that declares ``_no_split_modules = None`` (the PreTrainedModel default) and has no
    submodule that declares any."""

    config_class = TinyHFConfig
    base_model_prefix = "net"
    _no_split_modules = None

    def __init__(self, config: TinyHFConfig) -> None:
        super().__init__(config)
        self.net = _Layers()
        self.post_init()

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor = None, **kwargs) -> CausalLMOutput:
        return self.net(input_ids, labels)


def build_tinynet(shape: str, ctx: RankContext) -> nn.Module:
    """``plain`` (PlainNet) or ``hf_none`` (TinyHFModel), fp32, identical on every rank, on ``ctx.device``."""
    torch.manual_seed(ctx.seed)
    if shape == "plain":
        model = PlainNet()
    elif shape == "hf_none":
        model = TinyHFModel(TinyHFConfig())
    else:
        raise ValueError(f"unknown shape {shape!r} (expected plain or hf_none)")
    return model.to(ctx.device)
