"""trl PR #7304 (open): TRL's A2POTrainer prepares its frozen reference model with
``accelerator.prepare_model(ref_model, evaluation_mode=True)``. Under FSDP accelerate wraps a model only when it is
not in evaluation mode, so the reference stays a plain, unsharded copy on every rank, silently (the PR's author
reproduced it on CPU/gloo).

The cell prepares a PEFT policy through ``accelerator.prepare``, then the reference (the frozen base) as A2PO does
(``fix: none``) or with TRL's own ``prepare_fsdp``, which DPO and the PR use (``fix: prepare_fsdp``), and requires
it sharded; a forward of the reference on the shared batch must give finite logits.
"""

from __future__ import annotations

import torch

from fsdp_matrix.case import (
    CheckFailed,
    RankContext,
    accelerate_setup,
    axis,
    base_model,
    main,
    peft_model,
    synthetic_batch,
    wrapper_kind,
)

CASE = "ref-model-eval-prepare"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    fix = axis(params, "fix", ("none", "prepare_fsdp"))
    policy = peft_model(params, ctx, autocast=False)
    ref = base_model(params, ctx).requires_grad_(False).eval()
    with accelerate_setup(policy, params, ctx) as setup:
        if fix == "none":
            ref = setup.accelerator.prepare_model(ref, evaluation_mode=True)
        else:
            from trl.models.utils import prepare_fsdp

            ref = prepare_fsdp(ref, setup.accelerator)
        kind = wrapper_kind(ref)
        if kind not in ("fsdp1", "fsdp2"):
            raise CheckFailed(f"the reference model is {type(ref).__name__} ({kind}): a full copy on every rank")
        with torch.no_grad():
            logits = ref(synthetic_batch(ctx)).logits
        checks = setup.checks()
    if not torch.isfinite(logits).all():
        raise CheckFailed("the sharded reference model gives non-finite logits")
    return {**checks, "reference_wrapper": kind}


if __name__ == "__main__":
    main(run, CASE)
