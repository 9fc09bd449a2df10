"""Scratch repro for test_checks.py, run on 2 ranks: reliability review 2026-11-28 defect 3 as it happened. Each
rank destroys the launch's process group and initialises a 1-rank world of its own (what a library bug that
re-initialises the group, or a launcher variable lost on the way, does), then wraps and trains through
``wrap_and_train`` with the cell's 2-rank context.

``torchrun --nproc-per-node 2 tests/workload/scratch_world.py OUT``: each rank writes ``OUT/rank<r>.json`` with
``{"status": "ok" | "CheckFailed", "message": ..., "checks": {...}}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import distributed as dist

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.recipe import wrap_and_train

PARAMS = {"adapter": "lora", "dtype": "fp32", "wrap": "decoder_layer", "orig": 1, "model": "llama"}
"""The review's cell: FSDP1, one unit per decoder layer."""


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ctx = RankContext(rank, dist.get_world_size(), rank, torch.device("cpu"), "gloo", out)
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    model = add_adapter(build_model("llama", "fp32", ctx), "lora", seed=0)
    try:
        got = {"status": "ok", "message": "", "checks": wrap_and_train(model, PARAMS, ctx)}
    except CheckFailed as exc:
        got = {"status": "CheckFailed", "message": str(exc), "checks": {}}
    (out / f"rank{rank}.json").write_text(json.dumps(got, indent=1, default=str))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
