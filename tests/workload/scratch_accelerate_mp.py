"""Scratch repro for test_dtypes.py, run on 2 ranks: accelerate's FSDP2 with ``mixed_precision="bf16"`` on a bf16
LoRA model (adapters kept bf16, ``autocast=False``), through the accelerate entry's own setup, with the dtype check.
accelerate promises fp32 master weights (its log line names the parameters it upcast); accelerate 1.13.0 rebinds a
local instead (``param = param.to(torch.float32)``), so they stay bf16 (accelerate#3979, fixed in 1.14.0).

``torchrun --nproc-per-node 2 tests/workload/scratch_accelerate_mp.py OUT INIT...``: each rank writes
``OUT/rank<r>.json`` with ``{init: {"status", "message", "dtypes", "trainable_stored", "warnings"}}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import distributed as dist

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.checks import caught_warnings, trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.entry import accelerate_setup
from fsdp_matrix.workload.knobs import Loop
from fsdp_matrix.workload.meta_init import reference_for
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.training import synthetic_batch, train_and_check


def one(ctx: RankContext, init: str) -> dict:
    """One accelerate-entry run of the cell's model with bf16 mixed precision and every check."""
    params = {
        "adapter": "lora",
        "dtype": "bf16",
        "wrap": "fsdp2",
        "model": "llama",
        "entry": "accelerate",
        "init": init,
    }
    model = add_adapter(build_model("llama", "bf16", ctx), "lora", seed=0, autocast=False)
    names = trainable_names(model)
    reference = reference_for(model, synthetic_batch(ctx), ctx, params)
    with caught_warnings() as caught, accelerate_setup(model, params, ctx, mixed_precision="bf16") as setup:
        stored = sorted({str(p.dtype) for p in setup.model.parameters() if p.requires_grad})
        try:
            checks = train_and_check(
                setup.model,
                ctx,
                trainable=names,
                optimizer=setup.optimizer,
                backward=setup.accelerator.backward,
                reference=reference,
                loop=Loop.for_accelerate(setup.accelerator, params),
                params=params,
                entry={"mixed_precision": str(setup.accelerator.mixed_precision)},
            )
            got = {"status": "ok", "dtypes": checks.get("dtypes"), "message": ""}
        except CheckFailed as exc:
            got = {"status": "CheckFailed", "message": str(exc)}
    got["trainable_stored"] = stored
    got["warnings"] = [str(w.message)[:200] for w in caught if "upcast" in str(w.message).lower()]
    return got


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ctx = RankContext(rank, dist.get_world_size(), rank, torch.device("cpu"), "gloo", out)
    res = {}
    for init in sys.argv[2:]:
        try:
            res[init] = one(ctx, init)
        except Exception as exc:  # noqa: BLE001 - the test reads what each init did
            res[init] = {"status": type(exc).__name__, "message": str(exc)[:500]}
    (out / f"rank{rank}.json").write_text(json.dumps(res, indent=1, default=str))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
