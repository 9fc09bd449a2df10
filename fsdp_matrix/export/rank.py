"""The rank half of an exported script: process group, the cell run once, every rank's outcome printed on rank 0.
Only the standard library at module level (the launching process never imports torch)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import traceback
from datetime import timedelta
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, List

from fsdp_matrix.export.launch import OUTCOME_ENV, SCRATCH_ENV, parse_args


def run_once(run: Callable, params: Dict[str, Any], ctx: Any) -> Dict[str, Any]:
    try:
        return {"rank": ctx.rank, "error": None, "text": json.dumps(run(dict(params), ctx), default=str, indent=1)}
    except Exception as exc:  # the error is the observation: report it, then decide the exit code
        tb = exc.__traceback__
        while tb.tb_next:
            tb = tb.tb_next
        where = f"{tb.tb_frame.f_globals.get('__name__')}.{tb.tb_frame.f_code.co_name}"
        error = f"{type(exc).__name__}: {exc} (raised in {where})"
        return {"rank": ctx.rank, "error": error, "text": traceback.format_exc()}


def rank_main(run: Callable, context_cls: type, params: Dict, pins: Dict, argv: List[str], device: str, ws: int) -> int:
    import torch
    import torch.distributed as dist

    args = parse_args(argv, device, ws)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0))
    dev = torch.device("cuda", local) if args.device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", timeout=timedelta(seconds=args.timeout))
    # under the user's own torchrun nothing else removes the scratch folder: this node's rank 0 does, at the end
    given = os.environ.get(SCRATCH_ENV)
    scratch = Path(given or f"{tempfile.gettempdir()}/fsdp-repro-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}")
    scratch.mkdir(parents=True, exist_ok=True)
    world = dist.get_world_size()
    ctx = context_cls(rank, world, local, dev, dist.get_backend(), scratch)
    if rank == 0:
        print(", ".join(f"{n} {metadata.version(n)} (pinned {v})" for n, v in pins.items()), params, flush=True)
    torch.manual_seed(0)
    mine, outcomes = run_once(run, params, ctx), [None] * world
    try:
        dist.all_gather_object(outcomes, mine)  # after it, no rank uses the scratch folder
        dist.destroy_process_group()
    except Exception as exc:  # another rank is gone or stuck: say what this rank saw, alone
        print(f"[rank {rank}] could not gather the other ranks' outcomes ({type(exc).__name__}: {exc})", flush=True)
        outcomes = [mine]
    finally:
        if not given and local == 0:
            shutil.rmtree(scratch, ignore_errors=True)
    if rank != 0 and len(outcomes) == world:
        return 0
    for o in outcomes:
        print(f"===== rank {o['rank']}: {'error' if o['error'] else 'ok, checks'} =====\n{o['text'].rstrip()}")
    errors = "; ".join(f"rank {o['rank']}: {o['error']}" for o in outcomes if o["error"])
    print(f"===== outcome: {errors or 'every rank trained and passed the checks'}", flush=True)
    if os.environ.get(OUTCOME_ENV) and len(outcomes) == world:
        Path(os.environ[OUTCOME_ENV]).write_text("error" if errors else "ok")
        return 0
    return 1 if errors or len(outcomes) != world else 0
