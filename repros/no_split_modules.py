"""peft#2166 (report 4): ``fsdp_auto_wrap_policy`` on a model without ``_no_split_modules``.

With FSDP_TRANSFORMER_CLS_TO_WRAP unset, ``"".split(",")`` gives ``[""]`` and the class lookup for ``""`` fails:
``Could not find the transformer layer class to wrap in the model.`` (``Exception``, later ``TypeError``); fixed in
PEFT 0.14.0 (PR #2167). When the policy comes back, the cell wraps with it under FSDP1 and trains, so a fix only
holds if training works. ``cls_env`` ``bogus`` sets the variable to a class the model lacks, which raises by design.
"""

from __future__ import annotations

import os

import torch
from peft import get_peft_model
from peft.utils.other import fsdp_auto_wrap_policy

from fsdp_matrix.workload.adapters import lora_config
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.params import axis, flag
from fsdp_matrix.workload.tinynets import build_tinynet
from fsdp_matrix.workload.training import train_and_check
from fsdp_matrix.workload.wrapping import fsdp1

CASE = "no-split-modules"
ENV_VAR = "FSDP_TRANSFORMER_CLS_TO_WRAP"
CLS_ENV = {"unset": None, "bogus": "NoSuchDecoderLayer"}


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    model = build_tinynet(axis(params, "shape", ("plain", "hf_none")), ctx)
    torch.manual_seed(ctx.seed)
    model = get_peft_model(model, lora_config(task_type=None))
    value = CLS_ENV[axis(params, "cls_env", tuple(CLS_ENV), default="unset")]
    saved = os.environ.pop(ENV_VAR, None)
    try:
        if value is not None:
            os.environ[ENV_VAR] = value
        policy = fsdp_auto_wrap_policy(model)
    finally:
        # later cells in the same launch must see the caller's environment
        os.environ.pop(ENV_VAR, None)
        if saved is not None:
            os.environ[ENV_VAR] = saved
    return train_and_check(fsdp1(model, policy, flag(params, "orig", default=False), ctx), ctx)


if __name__ == "__main__":
    from fsdp_matrix.standalone import main

    main(run, CASE)
