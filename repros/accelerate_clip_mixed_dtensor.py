"""accelerate PR #4219 (1.15.0): ``accelerator.clip_grad_norm_`` over sharded (DTensor) and plain gradients.

With FSDP2 and a trainable module left out of ``fully_shard`` (accelerate's ``fsdp_ignored_modules``, from 1.11.0:
``FSDP_IGNORED_MODULES`` in a launched config), the model's gradients are a mix of DTensors and plain tensors, and
``clip_grad_norm_`` raises ``RuntimeError: aten._foreach_norm.Scalar got mixed torch.Tensor and DTensor, need to
convert all torch.Tensor to DTensor before calling distributed operators!`` (observed on accelerate 1.12.0; as in
https://github.com/kvcache-ai/ktransformers/issues/2145). accelerate 1.15.0
(https://github.com/huggingface/accelerate/pull/4219) clips DTensor and plain gradients apart and combines the norms.

The cell: LoRA plus a trainable ``modules_to_save`` copy of ``lm_head``, FSDP2 through ``Accelerator.prepare`` with
that copy ignored, ``clip`` none or 1.0. ``checks["unsharded_trainable"]`` counts the trainable parameters left plain.
"""

from __future__ import annotations

from unittest import mock

import torch
from peft import get_peft_model

from fsdp_matrix.case import (
    CheckFailed,
    DTensor,
    RankContext,
    base_model,
    lora_config,
    main,
    prepare_and_train,
    trainable_names,
)

CASE = "accelerate-clip-mixed-dtensor"
IGNORED = r".*lm_head\.modules_to_save\.default"
"""The module left out of ``fully_shard``, as a user's ``fsdp_ignored_modules`` regex (accelerate fullmatches it)."""


def _plain_trainable(model: torch.nn.Module) -> dict:
    plain = [n for n, p in model.named_parameters() if p.requires_grad and not isinstance(p, DTensor)]
    if not plain:
        raise CheckFailed(f"no trainable parameter left unsharded: this accelerate ignored {IGNORED!r}")
    return {"unsharded_trainable": len(plain)}


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    params = {"adapter": "lora", "entry": "accelerate", "wrap": "fsdp2", **params}
    torch.manual_seed(ctx.seed)
    model = get_peft_model(base_model(params, ctx), lora_config(modules_to_save=["lm_head"]))
    trainable = trainable_names(model)
    # as a launched config exports it; restored after the cell, which later cells of the launch must not see
    with mock.patch.dict("os.environ", {"FSDP_IGNORED_MODULES": IGNORED}):
        return prepare_and_train(model, params, ctx, trainable, inspect=_plain_trainable)


if __name__ == "__main__":
    main(run, CASE)
