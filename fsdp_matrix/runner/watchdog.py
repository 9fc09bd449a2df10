"""A launch's watchdog: ``python -m fsdp_matrix.runner.watchdog PID CREATE_TIME LAUNCH_ID``.

The coordinator (pytest, or ``python -m fsdp_matrix run``) can die without running any cleanup: SIGKILL, the OOM
killer, a cancelled CI job. Its ranks look for it only between cells, so a rank stuck in a cell never notices, and a
watchdog thread inside the rank cannot help when the rank hangs in C code holding the GIL. torchrun runs in its own
session, so a signal to the coordinator's process group misses it too.

So each launch gets this small process, in a session of its own. It watches the coordinator by pid AND create time
(a pid is reused once its owner is gone) and, once the coordinator is gone, SIGKILLs every process that carries the
launch's marker (``procs.MARKER``), torchrun and ranks alike, then exits. It carries the marker too: when the
launcher ends the launch itself, the same kill takes the watchdog with it.
"""

from __future__ import annotations

import sys
import time
from typing import List, Optional

from fsdp_matrix.runner import procs

POLL_S = 0.2
"""How often the coordinator is looked at: the launch dies within about this long of it (plus the sweep)."""


def sweep(launch_id: str, quiet_rounds: int = 2, pause_s: float = 0.2) -> int:
    """Kill every process of the launch until ``quiet_rounds`` sweeps in a row find none (one may be forking while
    we look). Returns how many were killed."""
    killed, quiet = 0, 0
    while quiet < quiet_rounds:
        found = procs.marked(launch_id)
        procs.kill_all(found, wait_s=pause_s)
        killed += len(found)
        quiet = 0 if found else quiet + 1
        time.sleep(pause_s)
    return killed


def watch(pid: int, create_time: float, launch_id: str, poll_s: float = POLL_S) -> int:
    while procs.same_process(pid, create_time) is not None:
        time.sleep(poll_s)
    killed = sweep(launch_id)
    print(f"watchdog: coordinator {pid} is gone; killed {killed} process(es) of launch {launch_id}", flush=True)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return watch(int(args[0]), float(args[1]), args[2])


if __name__ == "__main__":
    sys.exit(main())
