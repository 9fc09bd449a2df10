"""Scratch repro for test_units.py, run on 2 ranks: a buffer left unbroadcast. After wrapping, rank 1's rotary
``inv_freq`` (a non-persistent buffer, which ram-efficient loading leaves to each rank) differs from rank 0's; then
``train_and_check``. A healthy run of the same model is the control.

``torchrun --nproc-per-node 2 tests/workload/scratch_buffers.py OUT``: each rank writes ``OUT/rank<r>.json`` with
``{scenario: {"status": "ok" | "CheckFailed", "message": ..., "structure": {...}}}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import distributed as dist

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.corruption import take_reference
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import wrap


def scenario(ctx: RankContext, unbroadcast: bool) -> dict:
    model = add_adapter(build_model("llama", "fp32", ctx), "lora", seed=0)
    names, reference = trainable_names(model), take_reference(model, synthetic_batch(ctx))
    wrapped = wrap(model, "fsdp2", None, ctx)
    if unbroadcast and ctx.rank == 1:
        for name, buf in wrapped.named_buffers():
            if name.endswith("inv_freq"):
                buf.mul_(1.5)
    try:
        checks = train_and_check(wrapped, ctx, trainable=names, reference=reference, params={"wrap": "fsdp2"})
        return {"status": "ok", "message": "", "structure": checks["structure"]}
    except CheckFailed as exc:
        return {"status": "CheckFailed", "message": str(exc), "structure": {}}


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ctx = RankContext(rank, dist.get_world_size(), rank, torch.device("cpu"), "gloo", out)
    got = {"healthy": scenario(ctx, False), "unbroadcast": scenario(ctx, True)}
    (out / f"rank{rank}.json").write_text(json.dumps(got, indent=1, default=str))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
