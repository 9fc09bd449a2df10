"""Process-tree chores for the launcher: dump stacks, kill without orphans, read torchrun's failure summary.

A pid names a process only while it lives; the kernel hands it to the next process after. So a process is named by
its pid AND its create time (``same_process``) wherever a signal could reach the wrong one.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple, Union

import psutil

from fsdp_matrix.clip import clip
from fsdp_matrix.runner.protocol import ENV_LAUNCH, stack_file

MARKER = ENV_LAUNCH
"""Env var set on every process of a launch, so a sweep finds even children that escaped the tree."""


def same_process(pid: int, create_time: float) -> Optional[psutil.Process]:
    """The live process ``pid`` if it is the one born at ``create_time`` (psutil's clock), else None."""
    try:
        proc = psutil.Process(pid)
        # same boot clock, same tick: equal up to float noise; another process reusing the pid started later
        if abs(proc.create_time() - create_time) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS picks it), for a rendezvous this harness starts itself."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def loopback_interface() -> Optional[str]:
    """The name of the interface that holds 127.0.0.1 (``lo`` on Linux, ``lo0`` on macOS), or None."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addrs):
            return name
    return None


def tree(pid: int) -> List[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def marked(launch_id: Union[str, Set[str]]) -> List[psutil.Process]:
    """Every live process carrying this launch's marker (or any of these launches'): torchrun puts workers in new
    sessions, and children may daemonize."""
    wanted = {launch_id} if isinstance(launch_id, str) else set(launch_id)
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(MARKER) in wanted:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def launch_ids_under(results: Path) -> Set[str]:
    """Marker values of the launches whose directories are under ``results`` (``launches/<runner>/launch-N-<id>``)."""
    return {d.name.rsplit("-", 1)[-1] for d in Path(results).glob("launches/*/launch-*-*")}


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


def dump_stacks(ranks: Dict[int, Tuple[int, float]], stack_dir: Path, settle_s: float = 1.0) -> Dict[int, str]:
    """Ask each rank's faulthandler for every thread's Python stack (SIGUSR1); return rank -> new dump text.

    ``ranks`` maps rank -> (pid, create time) from its Hello: SIGUSR1's default action kills, so a process that
    merely reuses a dead rank's pid is never signalled; that rank's entry says why it has no stack instead.
    """
    offsets, out = {}, {}
    for rank, (pid, created) in ranks.items():
        path = stack_dir / stack_file(rank)
        offsets[rank] = path.stat().st_size if path.exists() else 0
        proc = same_process(pid, created)
        if proc is None:
            reused = psutil.pid_exists(pid)
            out[rank] = f"(no stack: rank {rank}'s process {pid} is no longer running" + (
                "; its pid now belongs to another process, which was not signalled)" if reused else ")"
            )
            continue
        try:
            proc.send_signal(signal.SIGUSR1)
        except psutil.NoSuchProcess:
            out[rank] = f"(no stack: rank {rank}'s process {pid} is no longer running)"
    if len(out) < len(ranks):
        time.sleep(settle_s)
    for rank in ranks:
        path = stack_dir / stack_file(rank)
        if rank not in out and path.exists():
            with open(path, encoding="utf-8", errors="replace") as fh:
                fh.seek(offsets[rank])
                out[rank] = fh.read()
    return out


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank[^)]*\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_LOCAL_FAILURE = re.compile(r"rank\s*:\s*\d+\s*\(local_rank\s*:\s*(\d+)\s*\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


_ROOT_CAUSE = "Root Cause (first observed failure)"


def torchrun_failures(stderr: str, local: bool = False) -> Dict[int, int]:
    """rank -> exit code from torchrun's ChildFailedError summary (negative = killed by that signal). It lists the
    ranks it stopped itself (SIGTERM, after the first failure) as failures too; see ``torchrun_root_cause``.
    ``local`` keys them by local rank: what one node's agent started, whatever its node rank."""
    return {int(rank): int(code) for rank, code in (_LOCAL_FAILURE if local else _FAILURE).findall(stderr)}


def torchrun_root_cause(stderr: str, local: bool = False) -> Set[int]:
    """The ranks torchrun names as the root cause (first observed failure); every listed rank when the summary
    has no such section (older releases list only the culprit). ``local``: by local rank."""
    head, found, tail = stderr.rpartition(_ROOT_CAUSE)
    return {int(rank) for rank, _ in (_LOCAL_FAILURE if local else _FAILURE).findall(tail if found else stderr)}


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
