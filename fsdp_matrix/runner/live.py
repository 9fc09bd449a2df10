"""What the launcher observed of one cell (``CellRun``), before it is judged."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from fsdp_matrix.records import RankResult


@dataclass(kw_only=True)
class CellRun:
    """What the launcher observed for one cell, before it is judged."""

    key: str
    """``case/cell``."""
    status: str
    """ok / error / hang / crash / env-error."""
    ranks: List[RankResult]
    """Per-rank results, with stacks (hang) and exit codes (crash)."""
    duration_s: float
    """From the first rank's start to the last rank's end (or to detection)."""
    launch: int = 0
    """Which launch ran it (0, 1, ... as launches are replaced)."""
    detect_s: Optional[float] = None
    """For hang/crash/one-rank errors: seconds from the first sign of trouble to the verdict."""
    note: str = ""
    """Why the launch was replaced after this cell, if it was."""
    hygiene: List[str] = field(default_factory=list)
    """Problems a rank found after the cell (leaked modules, child processes, broken group): the launch was replaced."""
    env_removed: List[str] = field(default_factory=list)
    """The caller's variables the launch's ranks were started without (protocol.STRIPPED_ENV_PREFIXES)."""
