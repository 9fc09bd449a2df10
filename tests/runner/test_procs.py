"""Process chores: a stack dump never signals a process that merely reuses a dead rank's pid."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from fsdp_matrix.runner.launcher import Launch, Launcher
from fsdp_matrix.runner.protocol import Task
from fsdp_matrix.runner.watching import LaunchState, Limits, decide


def test_stack_dump_spares_a_process_that_reuses_a_dead_ranks_pid(tmp_path):
    """SIGUSR1's default action kills. The Hello event named the rank by pid and create time; a process
    now holding that pid (here: a ``sleep`` started later) must not be signalled."""
    launcher = Launcher(run_root=tmp_path, python=sys.executable)
    torchrun = subprocess.Popen(["sleep", "60"])  # stands in for the launch's torchrun, which _stuck kills
    reuser = subprocess.Popen(["sleep", "60"])
    try:
        born = psutil.Process(reuser.pid).create_time()
        now = time.time()
        state = LaunchState(
            number=0,
            born=now,
            pids={1: (reuser.pid, born - 100.0)},  # rank 1's Hello named a process that is gone
            submitted=("c/x",),
            started={"c/x": {0: now, 1: now}},
        )
        live = Launch(tmp_path, torchrun, "pidreuse0000", state)
        launcher._tasks["c/x"] = Task(key="c/x", repro="r.py", params={})
        limits = Limits(ranks=2, cell_timeout=1.0, grace_s=1.0, startup_timeout=60.0)
        _, decisions = decide(state, [], now + 2.0, limits)  # a hang: every rank's stack is dumped, then the kill
        for decision in decisions:
            launcher._carry_out(live, decision)
        time.sleep(0.5)
        assert reuser.poll() is None, f"the pid's new owner was signalled (exit {reuser.returncode})"
        [rank1] = [r for r in launcher._done["c/x"].ranks if r.rank == 1]
        assert "no longer" in rank1.stack  # says why there is no stack instead of an empty dump
    finally:
        for p in (torchrun, reuser):
            p.kill()
            p.wait()


# torchrun 2.13's summary after rank 1 was SIGKILLed mid-cell (observed in the chaos test): it lists the rank it
# stopped itself (SIGTERM) under Failures, and the rank that died under Root Cause
SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
fsdp_matrix.runner.worker FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-22_18:32:56
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 2735)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 2735
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_18:32:55
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 2736)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 2736
======================================================
"""


def test_torchrun_summary_names_the_root_cause_apart_from_the_ranks_it_stopped():
    """The rank torchrun stopped (SIGTERM) is listed as a failure too; the root cause is the one that died."""
    from fsdp_matrix.runner import procs

    assert procs.torchrun_failures(SUMMARY) == {0: -15, 1: -9}
    assert procs.torchrun_root_cause(SUMMARY) == {1}
    only_culprit = SUMMARY.split("Root Cause")[1]  # releases that list the culprit alone
    assert procs.torchrun_root_cause(only_culprit) == {1}
