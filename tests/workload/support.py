"""Shared helpers for the workload tests: a one-rank gloo process group and a RankContext for it."""

from __future__ import annotations

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
