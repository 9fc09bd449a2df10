"""Process-tree chores for the launcher: dump stacks, kill without orphans, read torchrun's failure summary."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

import psutil

from fsdp_matrix.clip import clip

MARKER = "FSDP_MATRIX_LAUNCH"
"""Env var set on every process of a launch, so a sweep finds even children that escaped the tree."""


def tree(pid: int) -> List[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def marked(launch_id: str) -> List[psutil.Process]:
    """Every live process carrying this launch's marker (torchrun puts workers in new sessions; children may
    daemonize)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(MARKER) == launch_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill_all(procs: Iterable[psutil.Process], wait_s: float = 0.5) -> None:
    """SIGKILL every process. The wait is short on purpose: SIGKILL cannot be refused, and the ranks, orphaned
    by their killed torchrun, are reaped by init on its own schedule (a long wait here cost ~1.5 s a launch)."""
    procs = list(procs)
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=wait_s)


def dump_stacks(pids: Dict[int, int], stack_dir: Path, settle_s: float = 1.0) -> Dict[int, str]:
    """Ask each rank's faulthandler for every thread's Python stack (SIGUSR1); return rank -> new dump text."""
    offsets = {}
    for rank, pid in pids.items():
        path = stack_dir / f"stack-rank{rank}.txt"
        offsets[rank] = path.stat().st_size if path.exists() else 0
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(settle_s)
    out = {}
    for rank in pids:
        path = stack_dir / f"stack-rank{rank}.txt"
        if path.exists():
            with open(path, encoding="utf-8", errors="replace") as fh:
                fh.seek(offsets[rank])
                out[rank] = fh.read()
    return out


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank[^)]*\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def torchrun_failures(stderr: str) -> Dict[int, int]:
    """rank -> exit code from torchrun's ChildFailedError summary (negative = killed by that signal)."""
    return {int(rank): int(code) for rank, code in _FAILURE.findall(stderr)}


def signal_name(exit_code: Optional[int]) -> Optional[str]:
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def rank_logs(log_dir: Path, rank: int) -> Tuple[str, Optional[str]]:
    """Tail of a rank's stderr (where faulthandler writes a segfault's stack) and its torchrun error file, if any."""
    stderr, error = "", None
    for path in sorted(log_dir.glob(f"*/attempt_*/{rank}/stderr.log")):
        stderr = clip(path.read_text(errors="replace"), lines=60, tail=True)
    for path in sorted(log_dir.glob(f"*/attempt_*/{rank}/error.json")):
        error = path.read_text(errors="replace")
    return stderr, error
