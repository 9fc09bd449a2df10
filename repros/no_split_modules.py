"""fsdp_auto_wrap_policy on a model without _no_split_modules: https://github.com/huggingface/peft/issues/2166"""

from __future__ import annotations

import os

import torch
from peft import get_peft_model
from peft.utils.other import fsdp_auto_wrap_policy

from fsdp_matrix.case import (
    RankContext,
    axis,
    build_tinynet,
    flag,
    fsdp1,
    lora_config,
    main,
    train_and_check,
    trainable_names,
    trainer_setup,
    trainer_train_and_check,
)

CASE = "no-split-modules"
ENV_VAR = "FSDP_TRANSFORMER_CLS_TO_WRAP"
CLS_ENV = {"unset": None, "bogus": "NoSuchDecoderLayer"}


def through_trainer(model, value, params: dict, ctx: RankContext) -> dict:
    """The Trainer with ``fsdp="full_shard auto_wrap"``: for a PEFT model it builds PEFT's policy itself. The class
    to wrap is given as its users give it, ``fsdp_config["transformer_layer_cls_to_wrap"]`` (the Trainer exports it
    as the variable), or not at all."""
    from unittest import mock

    params = {**params, "wrap": "decoder_layer"}  # FSDP1, the Trainer's policy: the class is the cell's, or none
    extra = {"transformer_layer_cls_to_wrap": [value]} if value else {}
    trainable = trainable_names(model)
    with mock.patch.dict(os.environ):  # the caller's (or an earlier cell's) class must not reach this cell
        os.environ.pop(ENV_VAR, None)
        with trainer_setup(model, params, ctx, fsdp_config=extra) as trainer:
            return trainer_train_and_check(trainer, params, ctx, trainable)


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    model = build_tinynet(axis(params, "shape", ("plain", "hf_none")), ctx)
    torch.manual_seed(ctx.seed)
    model = get_peft_model(model, lora_config(task_type=None))
    value = CLS_ENV[axis(params, "cls_env", tuple(CLS_ENV), default="unset")]
    if axis(params, "entry", ("trainer",), default=None) == "trainer":
        return through_trainer(model, value, params, ctx)
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
    main(run, CASE)
