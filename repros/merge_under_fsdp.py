"""``merge_and_unload()`` on a LoRA model while FSDP holds it sharded (axolotl#3294, torchtune PR #506, unsloth#409).

Merging reads ``lora_B.weight @ lora_A.weight`` and adds it to the base weight. Outside a unit's forward FSDP1 holds
those weights as 1-D flat shards (empty on some ranks), so a merge there works on shards, not on the matrices: PEFT
raises nothing and the merged model computes something else. torchtune gathers first (``summon_full_params`` over the
LoRA and base units); FSDP2 keeps every parameter a DTensor with its full shape, and the merge runs on DTensors.

Axes: ``gather`` none (merge as is) / summon (inside ``FSDP.summon_full_params(model, writeback=True)``, FSDP1 only).
Each cell trains 3 steps (with the training checks), then merges. A fix holds when the merged model, run through the
same wrapper, gives the trained adapted model's logits and no LoRA layer is left.
"""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.fsdp import FullyShardedDataParallel

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.recipe import peft_model
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import wrap

CASE = "merge-under-fsdp"
TOLERANCE = 1e-4
"""Largest |merged - unmerged| logit difference that counts as equal (fp32; observed about 2e-7 where it worked)."""


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    gather = params["gather"]
    model = peft_model(params, ctx)
    trainable = trainable_names(model)
    orig = params.get("orig")
    wrapped = wrap(model, params["wrap"], None if orig is None else bool(orig), ctx)
    if gather == "summon" and not isinstance(wrapped, FullyShardedDataParallel):
        raise ValueError("gather summon is FSDP1 only")
    checks = train_and_check(wrapped, ctx, trainable=trainable)
    batch = synthetic_batch(ctx)
    wrapped.eval()
    with torch.no_grad():
        unmerged = wrapped(input_ids=batch).logits.float()
    if gather == "summon":
        scope = FullyShardedDataParallel.summon_full_params(wrapped, writeback=True)
    else:
        scope = contextlib.nullcontext()
    with torch.no_grad(), scope:
        model.merge_and_unload()
    left = sorted({type(m).__name__ for m in wrapped.modules() if hasattr(m, "lora_A")})
    with torch.no_grad():
        merged = wrapped(input_ids=batch).logits.float()
    diff = float((merged - unmerged).abs().max())
    checks.update({"merged_vs_unmerged": diff, "lora_layers_left": left})
    failed = []
    if not diff <= TOLERANCE:
        failed.append(f"merged output differs from the unmerged one by {diff} (max abs logit)")
    if left:
        failed.append(f"LoRA layers left after merge_and_unload: {left}")
    if failed:
        raise CheckFailed("; ".join(failed))
    return checks


if __name__ == "__main__":
    from fsdp_matrix.standalone import main

    main(run, CASE)
