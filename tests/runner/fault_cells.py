"""Test-only cells that misbehave on purpose, to prove the launcher survives them (not part of matrix.yaml).

Each behaviour is chosen by ``params["fault"]``; every one does a real collective first, as a real cell would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import torch
import torch.distributed as dist


def _collective(ctx) -> float:
    t = torch.ones(4, device=ctx.device) * (ctx.rank + 1)
    dist.all_reduce(t)
    return float(t.sum())


def run(params, ctx):
    fault = params["fault"]
    total = _collective(ctx)
    if fault == "ok":
        time.sleep(params.get("sleep", 0))
        return {"sum": total}
    if fault == "raise_both":
        raise ValueError(f"injected error on rank {ctx.rank}")
    if fault == "hang_rank1" and ctx.rank == 1:
        while True:  # a Python-level hang: the stack dump must show this line
            time.sleep(0.05)
    if fault == "exit_rank0" and ctx.rank == 0:
        os._exit(7)
    if fault == "segv_rank0" and ctx.rank == 0:
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "raise_rank1" and ctx.rank == 1:
        raise RuntimeError("injected error on rank 1 only")
    if fault == "leak_child":
        subprocess.Popen(["sleep", "600"])
        return {"sum": total}
    if fault == "leak_module":
        global _LEAK
        _LEAK = torch.nn.Linear(1024, 1024)  # 4 MiB: over the 1 MiB budget the fault test sets
        return {"sum": total}
    # ranks that are not the faulty one go on to the next collective, as a real training step would
    _collective(ctx)
    return {"sum": total}
