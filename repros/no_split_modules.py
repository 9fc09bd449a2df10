"""fsdp_auto_wrap_policy on a model without _no_split_modules: https://github.com/huggingface/peft/issues/2166"""

from __future__ import annotations

import contextlib
import os
from unittest import mock

from peft.utils.other import fsdp_auto_wrap_policy

from fsdp_matrix.case import (
    RankContext,
    add_adapter,
    axis,
    build_tinynet,
    flag,
    fsdp1,
    main,
    train_and_check,
    trainer_entry,
)

CASE = "no-split-modules"
ENV_VAR = "FSDP_TRANSFORMER_CLS_TO_WRAP"
CLS_ENV = {"unset": None, "bogus": "NoSuchDecoderLayer"}


@contextlib.contextmanager
def class_to_wrap(value):
    # the cell's alone: not the caller's (or an earlier cell's) class, and later cells see the caller's environment
    with mock.patch.dict(os.environ):
        os.environ.pop(ENV_VAR, None)
        if value is not None:
            os.environ[ENV_VAR] = value
        yield


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    net = build_tinynet(axis(params, "shape", ("plain", "hf_none")), ctx)
    model = add_adapter(net, "lora", ctx.seed, task_type=None)
    value = CLS_ENV[axis(params, "cls_env", tuple(CLS_ENV), default="unset")]
    if axis(params, "entry", ("trainer",), default=None) == "trainer":
        # the Trainer (fsdp="full_shard auto_wrap", FSDP1) builds PEFT's policy itself for a PEFT model; the class to
        # wrap is given as its users give it, fsdp_config["transformer_layer_cls_to_wrap"] (the Trainer exports it as
        # the variable), or not at all
        extra = {"transformer_layer_cls_to_wrap": [value]} if value else {}
        with class_to_wrap(None):
            return trainer_entry(model, {**params, "wrap": "decoder_layer"}, ctx, fsdp_config=extra)
    with class_to_wrap(value):
        policy = fsdp_auto_wrap_policy(model)
    return train_and_check(fsdp1(model, policy, flag(params, "orig", default=False), ctx), ctx)


if __name__ == "__main__":
    main(run, CASE)
