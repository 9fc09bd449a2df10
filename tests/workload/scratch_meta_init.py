"""Scratch repro for test_meta_init.py, run on 2 ranks: ram-efficient loading (rank 0 loads, rank 1 on meta), the
reference broadcast from rank 0, and training through torch FSDP1 and FSDP2.

``torchrun --nproc-per-node 2 tests/workload/scratch_meta_init.py OUT``: each rank writes ``OUT/rank<r>.json`` with
``{scenario: {"status": "ok" | <error type>, "message": ..., "checks": {...}}}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import distributed as dist

from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.corruption import take_reference
from fsdp_matrix.workload.meta_init import build_rank0_model, meta_names, reference_for
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import wrap

RAM = {"init": "ram_efficient"}


def lora(ctx: RankContext):
    return add_adapter(build_rank0_model("llama", "fp32", ctx), "lora", seed=0, autocast=False)


def built(ctx: RankContext) -> dict:
    model = lora(ctx)
    return {"meta": len(meta_names(model)), "params": len(list(model.parameters()))}


def references(ctx: RankContext) -> dict:
    model, batch = lora(ctx), synthetic_batch(ctx)
    local = take_reference(model, batch)  # rank 1's own model is meta: no usable reference
    shared = reference_for(model, batch, ctx, RAM)
    return {
        "local_error": local.error,
        "shared_error": shared.error,
        "shared_logits_sum": float(shared.logits.double().sum()),
        "shared_params": len(shared.params),
    }


def trained(ctx: RankContext, how: str) -> dict:
    model = lora(ctx)
    names, reference = trainable_names(model), reference_for(model, synthetic_batch(ctx), ctx, RAM)
    wrapped = wrap(model, how, True if how != "fsdp2" else None, ctx, init="ram_efficient")
    return train_and_check(wrapped, ctx, trainable=names, reference=reference)


SCENARIOS = {
    "built": built,
    "references": references,
    "fsdp1": lambda ctx: trained(ctx, "peft_policy"),
    "fsdp2": lambda ctx: trained(ctx, "fsdp2"),
}


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ctx = RankContext(rank, dist.get_world_size(), rank, torch.device("cpu"), "gloo", out / "scratch")
    ctx.scratch.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, scenario in SCENARIOS.items():
        try:
            results[name] = {"status": "ok", "checks": scenario(ctx)}
        except Exception as exc:  # noqa: BLE001 - recorded for the test to judge
            results[name] = {"status": type(exc).__name__, "message": str(exc)}
        dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(results, default=str))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
