"""Scratch repro for test_checkpoint.py, run on 2 ranks: train a LoRA under FSDP2, then save the adapter twice,
once deliberately wrong (only rank 0's local shard of every tensor, as accelerate < 1.15 wrote FSDP2 adapter-only
checkpoints, its PR #4206) and once right (full tensors), and run the checkpoint checks on each.

``torchrun --nproc-per-node 2 tests/workload/scratch_rank0_shard.py OUT``: each rank writes ``OUT/rank<r>.json``
with ``{mode: {"status": "ok" | "CheckFailed", "message": ...}}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from peft import PeftModel
from torch import distributed as dist
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import add_adapter, is_adapter
from fsdp_matrix.workload.checkpoint import (
    adapter_key,
    full_shapes,
    gathered_adapter,
    logits,
    on_every_rank,
    read_adapter_dir,
    reload_and_check,
)
from fsdp_matrix.workload.checkpoint_torch import write_adapter
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import wrap


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ctx = RankContext(rank, dist.get_world_size(), rank, torch.device("cpu"), "gloo", out)
    model = add_adapter(build_model("llama", "fp32", ctx), "lora", seed=0)
    expected = full_shapes(model)
    wrapped = wrap(model, "fsdp2", None, ctx)
    train_and_check(wrapped, ctx)
    trained = gathered_adapter(wrapped)
    batch = synthetic_batch(ctx)
    fsdp_logits = logits(wrapped, batch)
    state = {k: v for k, v in get_model_state_dict(wrapped).items() if is_adapter(k)}  # DTensors, sharded
    outcomes = {}
    for mode in ("rank0_shard", "full"):
        path = out / mode
        # a DTensor's full_tensor() is collective: every rank computes it, rank 0 writes
        tensors = {adapter_key(k): v.to_local() if mode == "rank0_shard" else v.full_tensor() for k, v in state.items()}
        on_every_rank(lambda: write_adapter(wrapped, tensors, path) if rank == 0 else None)  # noqa: B023

        def reload():
            return PeftModel.from_pretrained(build_model("llama", "fp32", ctx), str(path))  # noqa: B023

        try:
            reload_and_check(read_adapter_dir(path), reload, expected, trained, fsdp_logits, batch, torch.float32)
            outcomes[mode] = {"status": "ok"}
        except CheckFailed as exc:
            outcomes[mode] = {"status": "CheckFailed", "message": str(exc)}
        dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(outcomes))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
