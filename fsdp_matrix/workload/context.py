"""What one rank knows about the launch it runs in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

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
    """Per-launch temp dir shared by the ranks of this node, and only by them: on several nodes each has its own
    (e.g. tiny models saved for 4-bit loading). This node's local rank 0 writes (``is_local_main``), then barrier."""
    seed: int = 0
    """Seed for model init and the synthetic batch; the same on every rank so FSDP sees identical weights."""
    shared: Optional[Path] = None
    """A folder every rank sees, over all nodes (checkpoints one rank writes and all read back); None where the
    ranks share none (one node of a rendezvous of several machines). Rank 0 writes, then barrier."""
    local_world_size: Optional[int] = None
    """Ranks on this node (None: every rank is on one node)."""

    @property
    def is_main(self) -> bool:
        """True on rank 0, the rank that writes files every rank reads from ``shared``."""
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        """True on this node's local rank 0, the rank that writes files this node's ranks read from ``scratch``."""
        return self.local_rank == 0

    @property
    def nodes(self) -> int:
        """Nodes the ranks are spread over."""
        return self.world_size // (self.local_world_size or self.world_size)

    def shared_dir(self) -> Path:
        """``shared``; on one node, where it was not given, ``scratch`` (every rank sees it); else a one-line error:
        a file rank 0 writes for every rank needs a folder every node sees."""
        if self.shared is None and self.nodes == 1:
            return self.scratch
        if self.shared is None:
            raise RuntimeError(
                "this cell writes a file that every rank reads back, and its ranks share no folder (each node of a "
                "multi-machine rendezvous has its own scratch): run it on one machine"
            )
        return self.shared
