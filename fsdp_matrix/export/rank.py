"""The rank half of an exported script: process group, the cell run once, every rank's outcome printed on rank 0.
Inlined after the third-party imports, so it may use torch at module level.

The outcomes travel on a gloo group of their own. On the default group, a rank that raised alone met the others'
pending FSDP collective in its gather, and gloo aborted the process on the size mismatch (SIGABRT, ``EnforceNotMet``:
the export of trainer-save-only-model-sharded, observed 2026-11-29), so no outcome was printed; on its own group the
gather only waits (``--timeout``), then each rank says what it saw alone. Under the user's own torchrun nothing else
removes the scratch folder: this node's rank 0 does, at the end."""

from __future__ import annotations

import collections
import json
import os
import shutil
import tempfile
import traceback
from datetime import timedelta
from importlib import metadata
from pathlib import Path
from typing import Callable, Dict, List

import torch
from torch import distributed as dist

from fsdp_matrix.export.launch import OUTCOME_ENV, SCRATCH_ENV, parse_args

# what an upstream script's run(params, ctx) reads of its rank (a repro takes the workload's RankContext)
Context = collections.namedtuple("Context", "rank world_size local_rank device backend scratch")


def rank_main(run: Callable, context_cls: type, params: Dict, pins: Dict, argv: List[str], device: str, ws: int) -> int:
    args = parse_args(argv, device, ws)
    rank, local, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    dev = torch.device("cuda", local) if args.device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", timeout=timedelta(seconds=args.timeout))
    outcomes_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=args.timeout))  # not FSDP's traffic
    given = os.environ.get(SCRATCH_ENV)
    scratch = Path(given or f"{tempfile.gettempdir()}/fsdp-repro-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}")
    scratch.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        print(", ".join(f"{n} {metadata.version(n)} (pinned {v})" for n, v in pins.items()), params, flush=True)
    torch.manual_seed(0)
    try:
        checks = run(dict(params), context_cls(rank, world, local, dev, dist.get_backend(), scratch))
        mine = ("", f"===== rank {rank}: ok, checks =====\n{json.dumps(checks, default=str, indent=1)}")
    except Exception as exc:  # the error is the observation: report it, with the function that raised it
        frame = [*traceback.walk_tb(exc.__traceback__)][-1][0]
        where = f"{frame.f_globals.get('__name__')}.{frame.f_code.co_name}"
        error = f"rank {rank}: {type(exc).__name__}: {exc} (raised in {where})"
        mine = (error, f"===== rank {rank}: error =====\n{traceback.format_exc()}")
    outcomes = [mine] * world
    try:
        dist.all_gather_object(outcomes, mine, group=outcomes_group)  # after it, no rank uses the scratch folder
        dist.destroy_process_group()
    except Exception as exc:  # another rank is gone or stuck: say what this rank saw, alone
        print(f"[rank {rank}] could not gather the other ranks' outcomes ({type(exc).__name__}: {exc})", flush=True)
        outcomes, world = [mine], 0
    finally:
        if not given and local == 0:
            shutil.rmtree(scratch, ignore_errors=True)
    if rank != 0 and world:
        return 0
    errors = "; ".join(error for error, _ in outcomes if error)
    ok = "every rank trained and passed the checks"
    print(*(text.rstrip() for _, text in outcomes), f"===== outcome: {errors or ok}", sep="\n", flush=True)
    if os.environ.get(OUTCOME_ENV) and world:  # relaunch turns it into the exit code
        Path(os.environ[OUTCOME_ENV]).write_text("error" if errors else "ok")
        return 0
    return 1 if errors or not world else 0
