"""Scratch repro for test_collectives.py, run on 2 ranks: healthy accumulation under FSDP1 and FSDP2, then each
pattern the collectives check must catch, made on purpose, through ``train_and_check``.

``torchrun --nproc-per-node 2 tests/workload/scratch_collectives.py OUT``: each rank writes ``OUT/rank<r>.json`` with
``{scenario: {"status": "ok" | "CheckFailed", "message": ..., "collectives": {...}}}``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Callable, Dict

import torch
from torch import distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.knobs import Knobs, Loop
from fsdp_matrix.workload.models import build_model, decoder_layers
from fsdp_matrix.workload.training import train_and_check
from fsdp_matrix.workload.wrapping import fully_shard, wrap


def lora(ctx: RankContext) -> nn.Module:
    return add_adapter(build_model("llama", "fp32", ctx), "lora", seed=0, autocast=False)


def healthy(wrap_as: str, orig=None) -> Callable[[RankContext], dict]:
    def scenario(ctx: RankContext) -> dict:
        model = lora(ctx)
        names = trainable_names(model)
        params = {"wrap": wrap_as, "accum": 2, **({"orig": orig} if orig is not None else {})}
        return train_and_check(wrap(model, wrap_as, orig, ctx), ctx, trainable=names, params=params)

    return scenario


def root_only(ctx: RankContext) -> dict:
    """Sharded at the root only, where the cell's wrap promises a unit per decoder layer."""
    model = lora(ctx)
    names = trainable_names(model)
    fully_shard(model, mesh=init_device_mesh("cpu", (ctx.world_size,)))
    return train_and_check(model, ctx, trainable=names, params={"wrap": "fsdp2"})


def sync_every_micro_step(ctx: RankContext) -> dict:
    """Accumulation whose micro-steps all sync (a no_sync that does nothing, as accelerate's FSDP2 one before 1.11)."""
    model = lora(ctx)
    names = trainable_names(model)
    wrapped = wrap(model, "fsdp2", None, ctx)
    loop = Loop(Knobs(accum=2, given=("accum",)), micro=lambda m, last: contextlib.nullcontext())
    return train_and_check(wrapped, ctx, trainable=names, loop=loop, params={"wrap": "fsdp2"})


def hooks_bypassed(ctx: RankContext) -> dict:
    """Decoder layer 0's FSDP2 hooks never unshard it: it is gathered once by hand before training and left unsharded
    (what a layer whose hooks never fire needs to run at all), so training still works and only the count shows it."""
    model = lora(ctx)
    names = trainable_names(model)
    wrapped = wrap(model, "fsdp2", None, ctx)
    layer = decoder_layers(wrapped)[0]
    layer.unshard()
    group = layer._get_fsdp_state()._fsdp_param_group
    for hook in ("unshard", "wait_for_unshard", "reshard"):
        setattr(group, hook, lambda *args, **kwargs: None)
    return train_and_check(wrapped, ctx, trainable=names, params={"wrap": "fsdp2"})


SCENARIOS: Dict[str, Callable[[RankContext], dict]] = {
    "fsdp2_accum2": healthy("fsdp2"),
    "fsdp1_accum2": healthy("decoder_layer", orig=True),
    "root_only": root_only,
    "sync_every_micro_step": sync_every_micro_step,
    "hooks_bypassed": hooks_bypassed,
}


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ctx = RankContext(rank, world, rank, torch.device("cpu"), "gloo", out)
    outcomes = {}
    for name, scenario in SCENARIOS.items():
        try:
            checks = scenario(ctx)
            outcomes[name] = {"status": "ok", "collectives": checks.get("collectives")}
        except CheckFailed as exc:
            outcomes[name] = {"status": "CheckFailed", "message": str(exc)}
        except Exception as exc:  # noqa: BLE001 - recorded for the test to show
            outcomes[name] = {"status": type(exc).__name__, "message": str(exc)[:500]}
        dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(outcomes))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
