"""Shared helpers for the workload tests: a one-rank gloo process group and a RankContext for it, and a real
2-rank torchrun launch of a scratch script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import distributed as dist

from fsdp_matrix.workload.context import RankContext


def one_rank_group(tmp: Path) -> None:
    """Start a world-size-1 gloo group (FSDP needs one); a file store avoids picking a free port."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{tmp / 'pg-store'}", rank=0, world_size=1)


def cpu_context(scratch: Path, seed: int = 0) -> RankContext:
    return RankContext(
        rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo", scratch=scratch, seed=seed
    )


def run_two_ranks(script: Path, *args: str, timeout: int = 540) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 script args`` on gloo, importing this checkout; the result."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "MASTER_"))}
    env.update(PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    return subprocess.run(cmd + list(args), env=env, capture_output=True, text=True, timeout=timeout)


def failed_on_both_ranks(outcomes, scenario: str) -> str:
    """The CheckFailed message of a scenario, which must be the same on both ranks (every rank reaches the same
    verdict)."""
    got = [o[scenario] for o in outcomes]
    assert [g["status"] for g in got] == ["CheckFailed", "CheckFailed"], got
    assert got[0]["message"] == got[1]["message"]
    return got[0]["message"]
