"""A launch dies with its coordinator: ranks and torchrun must not outlive a killed pytest or ``run`` process, even
when a rank is stuck in a cell (in Python, or in C code holding the GIL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fsdp_matrix.runner import procs

HERE = Path(__file__).resolve().parent
GONE_WITHIN_S = 20.0
"""Generous: proves the launch is taken down at all, and in seconds rather than at the 300 s cell timeout."""


def marked(launch_ids) -> list:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(procs.MARKER) in launch_ids:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def launch_ids(results: Path) -> set:
    return {d.name.rsplit("-", 1)[-1] for d in results.glob("launches/*/launch-*")}


def wait_until_gone(ids, within_s: float) -> list:
    deadline = time.monotonic() + within_s
    while (alive := marked(ids)) and time.monotonic() < deadline:
        time.sleep(0.25)
    return alive


def start_run(results: Path, cell: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "fsdp_matrix", "run", "--matrix", str(HERE / "fault_matrix.yaml")]
    cmd += ["--results", str(results), "--cell-timeout", "300", *extra, cell]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def wait_for_cell_start(results: Path, proc: subprocess.Popen, timeout_s: float = 240.0) -> None:
    """Until both ranks have started the cell (their Start events are in the launch directory)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        files = list(results.glob("launches/*/launch-*/rank*.jsonl"))
        if len(files) == 2 and all('"event": "start"' in f.read_text() for f in files):
            return
        time.sleep(0.2)
    raise AssertionError(f"the cell never started (run exited {proc.poll()})")


@pytest.fixture
def leftovers():
    """Whatever a failing test leaves running is killed, so one failure does not load the machine for the rest."""
    ids: set = set()
    yield ids
    procs.kill_all(marked(ids))


# each costs a launch of its own: nox -s heavy. nox -s tests keeps test_chaos's run SIGKILLed while a rank hangs in C
@pytest.mark.heavy
@pytest.mark.parametrize("fault", ["hang_rank1", "hang_c_rank1"])
def test_sigkilled_coordinator_takes_its_launch_down(tmp_path, leftovers, fault):
    """``run`` (or pytest) SIGKILLed while rank 1 hangs in a cell."""
    run = start_run(tmp_path, f"faults/fault_{fault}-ws2")
    try:
        wait_for_cell_start(tmp_path, run)
        time.sleep(1.0)  # rank 1 is in its hang now
        leftovers |= launch_ids(tmp_path)
        assert marked(leftovers), "the launch should be running"
        os.kill(run.pid, signal.SIGKILL)  # the coordinator alone: nothing gets a chance to clean up
        run.wait()
        alive = wait_until_gone(leftovers, GONE_WITHIN_S)
        assert alive == [], [(p.pid, p.name()) for p in alive]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
