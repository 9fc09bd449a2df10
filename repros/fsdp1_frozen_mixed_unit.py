"""pytorch#91165 (PRs #104427, #104967): FSDP1 ``use_orig_params=True`` with frozen and trainable parameters in one
unit trains, with a UserWarning, and with the gradient memory of an unfrozen model.

``use_orig_params=True`` lets one FSDP1 unit hold frozen and trainable parameters (the issue asked for it), but the
unit's ``FlatParameter`` then requires grad as a whole: its gradient is allocated for the frozen parameters too, so
LoRA saves no gradient memory there. Since torch 2.1 a ``ModuleWrapPolicy`` / ``CustomPolicy`` says so when it wraps
such a module: ``UserWarning: <module> has both parameters with requires_grad=True and False. We do not recommend
wrapping such modules since the gradient memory usage will be higher than expected ...`` (with
``use_orig_params=False`` the same check raises). The fix the warning asks for: put the frozen parameters in their
own units, as PEFT's ``fsdp_auto_wrap_policy`` does (each trainable leaf its own unit).

Axis ``policy`` (FSDP1, ``use_orig_params=True``):

- ``module_wrap``: ``ModuleWrapPolicy({decoder layer class})``: LoRA inside the frozen layer's unit (the warning);
- ``split``: the same as a ``CustomPolicy`` that also wraps every leaf whose weight requires grad (PEFT's split; a
  functional policy, as PEFT's own, is not checked at all, so it could not show the warning's absence).

3 steps and the usual checks. ``checks["fsdp_frozen_warnings"]`` lists the module names the warnings named.
"""

from __future__ import annotations

import re

from torch import nn
from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy

from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.models import decoder_layer_class
from fsdp_matrix.workload.params import axis
from fsdp_matrix.workload.recipe import peft_model
from fsdp_matrix.workload.training import train_and_check
from fsdp_matrix.workload.wrapping import fsdp1

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
    import warnings

    model = peft_model({"adapter": "lora", "model": "llama", **params}, ctx)
    trainable = trainable_names(model)
    policy = policy_for(model, axis(params, "policy", POLICIES))
    # the worker records every warning of run() for the rule; this copy only names the modules in the checks
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped = fsdp1(model, policy, True, ctx)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)  # back to the worker's record
    checks = train_and_check(wrapped, ctx, trainable=trainable)
    checks["fsdp_frozen_warnings"] = sorted({m.group(1) for w in caught for m in [WARNING.search(str(w.message))] if m})
    return checks


if __name__ == "__main__":
    from fsdp_matrix.standalone import main

    main(run, CASE)
