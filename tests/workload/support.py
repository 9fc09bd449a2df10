"""Shared helpers for the workload tests: a one-rank gloo process group and a RankContext for it, and a real
2-rank torchrun launch of a scratch script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
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


def launch_failure(proc: subprocess.CompletedProcess, out: Path) -> str:
    """What a failed 2-rank launch left: its exit code, which rank files were written, and the last 20,000 characters
    of each stream. A rank that aborts at exit ("terminate called without an active exception", seen once under
    xdist load, 2026-11-28) prints its cause far above torchrun's summary, which a 3,000-character tail cut off."""
    written = sorted(p.name for p in out.glob("rank*.json")) if out.is_dir() else []
    return (
        f"torchrun exited {proc.returncode}; rank files written: {written or 'none'}\n"
        f"--- stdout (last 20000) ---\n{proc.stdout[-20000:]}\n--- stderr (last 20000) ---\n{proc.stderr[-20000:]}"
    )


def rank_outcomes(proc: subprocess.CompletedProcess, out: Path, ranks=(0, 1)) -> list:
    """Each rank's ``OUT/rank<r>.json``, which every scratch script writes once, after all its scenarios ran and just
    before ``destroy_process_group``. A rank that then dies in gloo's teardown ("terminate called without an active
    exception", SIGABRT; seen at load 15 and once under xdist, 2026-11-28) changes none of them, so they are judged,
    with a warning; a rank that died before writing its file fails here, with what the launch printed. Gloo's worker
    threads can outlive the interpreter's teardown: https://github.com/pytorch/pytorch/pull/179291."""
    files = [out / f"rank{rank}.json" for rank in ranks]
    if proc.returncode != 0 and all(f.exists() for f in files):
        warnings.warn(
            f"torchrun exited {proc.returncode} after every rank wrote its outcomes: {proc.stderr[-500:]}", stacklevel=2
        )
    else:
        assert proc.returncode == 0, launch_failure(proc, out)
    return [json.loads(f.read_text()) for f in files]


def failed_on_both_ranks(outcomes, scenario: str) -> str:
    """The CheckFailed message of a scenario, which must be the same on both ranks (every rank reaches the same
    verdict)."""
    got = [o[scenario] for o in outcomes]
    assert [g["status"] for g in got] == ["CheckFailed", "CheckFailed"], got
    assert got[0]["message"] == got[1]["message"]
    return got[0]["message"]
