"""FSDP1 frozen and trainable parameters in one unit: https://github.com/pytorch/pytorch/issues/91165"""

from __future__ import annotations

import re

from torch import nn
from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy

from fsdp_matrix.case import (
    RankContext,
    axis,
    caught_warnings,
    decoder_layer_class,
    fsdp1,
    main,
    peft_model,
    train_and_check,
    trainable_names,
)

CASE = "fsdp1-frozen-mixed-unit"
POLICIES = ("module_wrap", "split")
WARNING = re.compile(r"(\S+) has both parameters with requires_grad=True and False")


def _trainable_leaf(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return not list(module.children()) and weight is not None and weight.requires_grad


def policy_for(model: nn.Module, kind: str):
    layer = decoder_layer_class(model)
    if kind == "module_wrap":
        return ModuleWrapPolicy({layer})
    return CustomPolicy(lambda m: isinstance(m, layer) or _trainable_leaf(m))


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    model = peft_model({"adapter": "lora", "model": "llama", **params}, ctx)
    trainable = trainable_names(model)
    policy = policy_for(model, axis(params, "policy", POLICIES))
    # replayed to the worker, which records every warning of run() for the rule; this copy names the modules
    with caught_warnings(replay=True) as caught:
        wrapped = fsdp1(model, policy, True, ctx)
    checks = train_and_check(wrapped, ctx, trainable=trainable)
    checks["fsdp_frozen_warnings"] = sorted({m.group(1) for w in caught for m in [WARNING.search(str(w.message))] if m})
    return checks


if __name__ == "__main__":
    main(run, CASE)
