"""Process chores: a stack dump never signals a process that merely reuses a dead rank's pid."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from fsdp_matrix.runner.launcher import Launcher, _Live
from fsdp_matrix.runner.protocol import Hello, Task


def test_stack_dump_spares_a_process_that_reuses_a_dead_ranks_pid(tmp_path):
    """Defect 12: SIGUSR1's default action kills. The Hello event named the rank by pid and create time; a process
    now holding that pid (here: a ``sleep`` started later) must not be signalled."""
    launcher = Launcher(run_root=tmp_path, python=sys.executable)
    torchrun = subprocess.Popen(["sleep", "60"])  # stands in for the launch's torchrun, which _stuck kills
    reuser = subprocess.Popen(["sleep", "60"])
    try:
        live = _Live(0, tmp_path, torchrun, "pidreuse0000")
        born = psutil.Process(reuser.pid).create_time()
        launcher.worker_hello(live, 1, Hello(pid=reuser.pid, rank=1, create_time=born - 100.0))
        launcher._tasks["c/x"] = Task(key="c/x", repro="r.py", params={})
        live.submitted.append("c/x")
        live.started["c/x"] = {0: time.time(), 1: time.time()}
        launcher._stuck(live, "c/x", "hang", time.time(), "no result")
        time.sleep(0.5)
        assert reuser.poll() is None, f"the pid's new owner was signalled (exit {reuser.returncode})"
        [rank1] = [r for r in launcher._done["c/x"].ranks if r.rank == 1]
        assert "no longer" in rank1.stack  # says why there is no stack instead of an empty dump
    finally:
        for p in (torchrun, reuser):
            p.kill()
            p.wait()
