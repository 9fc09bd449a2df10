"""What the launcher knows of one launch while it runs (``_Live``), and what it observed of one cell (``CellRun``)."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

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


@dataclass
class _Live:
    """Bookkeeping for the launch currently running."""

    number: int
    run_dir: Path
    proc: subprocess.Popen
    launch_id: str
    seq: int = 0
    pids: Dict[int, Tuple[int, float]] = field(default_factory=dict)
    """rank -> (pid, create time) from its Hello: names the process, not just whoever holds the pid later."""
    ready: set = field(default_factory=set)
    byes: set = field(default_factory=set)
    offsets: Dict[int, int] = field(default_factory=dict)
    started: Dict[str, Dict[int, float]] = field(default_factory=dict)
    ended: Dict[str, Dict[int, RankResult]] = field(default_factory=dict)
    end_t: Dict[str, float] = field(default_factory=dict)
    clean: Dict[str, Dict[int, List[str]]] = field(default_factory=dict)
    retiring: Optional[str] = None
    born: float = field(default_factory=time.monotonic)
    submitted: List[str] = field(default_factory=list)
    timeouts: Dict[str, float] = field(default_factory=dict)
    """Cells with a timeout of their own (Task.timeout_s: a rule that expects a hang); the others use the
    launcher's ``cell_timeout``."""
    watchdog: Optional[subprocess.Popen] = None
    """The launch's watchdog process (watchdog.py)."""
    gone: bool = False
    """Replaced or closed: nothing more is decided about it."""
    env_removed: List[str] = field(default_factory=list)
    """The caller's variables its ranks were started without."""
    more_agents: List[Tuple[Path, subprocess.Popen]] = field(default_factory=list)
    """A multi-node launch on this machine: the run directory and torchrun agent of nodes 1, 2, ... (node 0's are
    ``run_dir`` and ``proc``). Each node has its own directory, as each machine of a real multi-node run would."""

    @property
    def agents(self) -> List[Tuple[Path, subprocess.Popen]]:
        """(run directory, torchrun) of every node this launcher started, node 0 first."""
        return [(self.run_dir, self.proc), *self.more_agents]

    def exited(self) -> bool:
        """Some node's torchrun has exited (for a one-node launch: torchrun has)."""
        return any(proc.poll() is not None for _, proc in self.agents)

    def returncode(self) -> Optional[int]:
        """The first non-zero exit code of the agents that exited, else 0 when all did, else None."""
        codes = [proc.poll() for _, proc in self.agents]
        bad = [c for c in codes if c not in (None, 0)]
        return bad[0] if bad else (0 if all(c == 0 for c in codes) else None)
