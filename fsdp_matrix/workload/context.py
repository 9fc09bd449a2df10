"""What one rank knows about the launch it runs in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class RankContext:
    """One rank's view of a launch, handed to every repro's ``run(params, ctx)``."""

    rank: int
    """Global rank."""
    world_size: int
    """Number of ranks in the process group."""
    local_rank: int
    """Rank on this host: picks the CUDA device."""
    device: torch.device
    """``cpu``, or ``cuda:<local_rank>``."""
    backend: str
    """Process-group backend: ``gloo`` (cpu) or ``nccl`` (cuda)."""
    scratch: Path
    """Per-launch temp dir shared by all ranks (e.g. tiny models saved for 4-bit loading); rank 0 writes, then
    barrier."""
    seed: int = 0
    """Seed for model init and the synthetic batch; the same on every rank so FSDP sees identical weights."""

    @property
    def is_main(self) -> bool:
        """True on rank 0, the rank that writes shared files."""
        return self.rank == 0
