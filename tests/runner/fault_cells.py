"""Test-only cells that misbehave on purpose, to prove the launcher survives them (not part of matrix.yaml).

Each behaviour is chosen by ``params["fault"]``; every one does a real collective first, as a real cell would.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist


def _collective(ctx) -> float:
    t = torch.ones(4, device=ctx.device) * (ctx.rank + 1)
    dist.all_reduce(t)
    return float(t.sum())


def _every_rank_ended(run_dir: Path, timeout_s: float = 60.0) -> None:
    """Wait until every rank of the launch has written as many End events as this one (protocol: one JSON line each)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ends = [f.read_text().count('"event": "end"') for f in sorted(run_dir.glob("rank*.jsonl"))]
        if ends and min(ends) == max(ends):
            return
        time.sleep(0.05)


class _CleanupTrap(torch.nn.Module):
    """Left alive by the cell. Between cells the rank's hygiene scan calls ``parameters()`` on every live module,
    which is where this one dies or stalls: after every rank reported End, before this rank reports Clean."""

    def __init__(self, run_dir: Path, how: str) -> None:
        super().__init__()
        self.run_dir, self.how = run_dir, how

    def parameters(self, recurse: bool = True):
        _every_rank_ended(self.run_dir)
        if self.how == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:
            time.sleep(0.05)


def run(params, ctx):
    fault = params["fault"]
    total = _collective(ctx)
    if fault == "ok":
        time.sleep(params.get("sleep", 0))
        return {"sum": total}
    if fault == "warn":
        warnings.warn(f"injected warning on rank {ctx.rank}", UserWarning, stacklevel=1)
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
    if fault == "segv_rank1":
        if ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGSEGV)
        # rank 0 is busy outside any collective (no peer error to raise): torchrun stops it when rank 1 dies
        time.sleep(30)
        return {"sum": total}
    if fault in ("die_in_cleanup_rank1", "stall_in_cleanup_rank1"):
        if ctx.rank == 1:
            global _TRAP
            _TRAP = _CleanupTrap(Path(ctx.scratch).parent, "die" if fault.startswith("die") else "stall")
        return {"sum": total}
    if fault == "hang_c_once_rank1":
        # a transient hang (the chaos test's): the first attempt hangs in C on rank 1, a re-run trains
        flag = Path(os.environ["FSDP_MATRIX_CHAOS_DIR"]) / f"hung-{params.get('n', 0)}"
        if ctx.rank == 1 and not flag.exists():
            flag.touch()
            fault = "hang_c_rank1"
        else:
            return {"sum": total}
    if fault == "hang_c_rank1" and ctx.rank == 1:
        # PyDLL keeps the GIL through the call: no Python code of this rank (no watchdog thread) runs again
        libc = ctypes.PyDLL(None)
        while True:
            libc.sleep(3600)
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
