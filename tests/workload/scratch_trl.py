"""Scratch run for test_trl_trainer.py on 2 ranks: real cells through TRL's SFTTrainer with ``peft_config``.

``torchrun --nproc-per-node 2 tests/workload/scratch_trl.py OUT``: each rank writes ``OUT/rank<r>.json`` with
``{scenario: {"status": "ok" | <exception class>, "message": ..., "checks": {...}}}``. Scenarios:

- ``fsdp1``: a tiny fp32 Llama, LoRA through TRL, FSDP1 ``use_orig_params=True``: trains and passes every check;
- ``no_shim``: the same with the CPU shim left out: accelerate gives TRL a DDP model, which must fail the "really
  FSDP" check, never pass;
- ``bf16_mp``: a bf16 Llama with TRL's ``bf16=True`` (FSDP mixed precision): accelerate upcasts bf16 adapters to
  fp32 master weights when it wraps, which the sharding check promises in fp32 (``checks["master_fp32"]``).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from unittest import mock

import torch
from torch import distributed as dist

from fsdp_matrix.workload import trl_trainer
from fsdp_matrix.workload.adapters import lora_config
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.cpu_shim import ShimRecord
from fsdp_matrix.workload.models import build_model

SCENARIOS = {
    "fsdp1": ({"adapter": "lora", "dtype": "fp32", "orig": 1, "wrap": "decoder_layer", "entry": "trl"}, {}),
    "no_shim": ({"adapter": "lora", "dtype": "fp32", "orig": 1, "wrap": "decoder_layer", "entry": "trl"}, {}),
    "bf16_mp": ({"adapter": "lora", "dtype": "bf16", "orig": 1, "wrap": "decoder_layer", "entry": "trl"}, {}),
}


@contextlib.contextmanager
def _no_shim(device, version, trainer=False, saves=False):
    yield ShimRecord(False)


def scenario(ctx: RankContext, name: str) -> dict:
    params, overrides = SCENARIOS[name]
    patch = mock.patch.object(trl_trainer, "cpu_fsdp_shim", _no_shim) if name == "no_shim" else contextlib.nullcontext()
    try:
        with patch:
            base = build_model("llama", params["dtype"], ctx)
            checks = trl_trainer.trl_entry(base, lora_config(), params, ctx, **overrides)
        return {"status": "ok", "checks": checks}
    except Exception as exc:  # the outcome is what the test judges
        return {"status": type(exc).__name__, "message": str(exc)[:500]}
    finally:
        dist.barrier()


def main(out: Path, names) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ctx = RankContext(rank, dist.get_world_size(), rank, torch.device("cpu"), "gloo", out)
    outcomes = {name: scenario(ctx, name) for name in names or SCENARIOS}
    (out / f"rank{rank}.json").write_text(json.dumps(outcomes, indent=1, default=str))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
