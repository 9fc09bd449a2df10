"""Fault injection: the batched runner must survive hangs, crashes, one-rank errors and leaks, and say so.

One launcher runs a healthy cell after every fault, so each test also proves that the next cell still runs.
Detection times are bounded generously: they prove a timeout is enforced, not how fast this machine is.
"""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from fsdp_matrix.cells import Cell
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.runner import procs
from fsdp_matrix.runner.launcher import Launcher
from fsdp_matrix.runner.session import Session

HERE = Path(__file__).resolve().parent
TIMEOUT = 12.0
SEQUENCE = [
    "ok",
    "hang_rank1",
    "ok",
    "exit_rank0",
    "ok",
    "segv_rank0",
    "ok",
    "raise_rank1",
    "ok",
    "leak_child",
    "ok",
    "raise_both",
    "ok",
    "leak_module",
    "ok",
]


def _cell(i, fault):
    return Cell("faults", (("fault", fault), ("n", i)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    results = tmp_path_factory.mktemp("faults")
    # a 1 MiB leak budget: the leak_module fault (4 MiB) must retire its launch; keep_dirs keeps even clean ones
    launcher = Launcher(
        run_root=results / "launches", cell_timeout=TIMEOUT, python=sys.executable, leak_budget_mb=1, keep_dirs=True
    )
    session = Session(load_matrix(HERE / "fault_matrix.yaml"), launcher, results, {"torch": "2.13.0"}, repo_root=HERE)
    cells = [_cell(i, f) for i, f in enumerate(SEQUENCE)]
    session.prefetch(cells)
    try:
        records = [session.run(c) for c in cells]
    finally:
        session.close()
    return records, launcher


def _after(records, fault):
    i = SEQUENCE.index(fault)
    return records[i], records[i + 1]


def test_healthy_cells_pass_after_every_fault(runs):
    records, _ = runs
    healthy = [r for r, f in zip(records, SEQUENCE) if f == "ok"]
    assert [r.verdict for r in healthy] == ["fix-holds"] * len(healthy)
    assert all(r.observed.checks == {"sum": 12.0} for r in healthy)


def test_hang_on_rank1_is_detected_with_every_stack(runs):
    rec, nxt = _after(runs[0], "hang_rank1")
    assert rec.verdict == "hang"
    stacks = {r.rank: r.stack or "" for r in rec.observed.ranks}
    assert "fault_cells.py" in stacks[1] and "time.sleep" not in stacks[0]
    assert "in run" in stacks[1]  # faulthandler's frame line for the hanging function
    assert rec.duration_s < TIMEOUT + 15
    assert rec.observed.detect_s is not None and rec.observed.detect_s < 10
    assert nxt.verdict == "fix-holds"


@pytest.mark.parametrize("fault,code,signal", [("exit_rank0", 7, None), ("segv_rank0", -11, "SIGSEGV")])
def test_crash_is_recorded_with_exit_code_or_signal(runs, fault, code, signal):
    rec, nxt = _after(runs[0], fault)
    assert rec.verdict == "crash"
    rank0 = next(r for r in rec.observed.ranks if r.rank == 0)
    assert rank0.exit_code == code and rank0.signal == signal
    if signal:
        assert "Segmentation fault" in (rank0.stack or "")  # faulthandler's dump from the rank's stderr
    assert rec.observed.detect_s < 15
    assert nxt.verdict == "fix-holds"


def test_error_on_one_rank_is_detected_before_the_timeout(runs):
    rec, nxt = _after(runs[0], "raise_rank1")
    assert rec.verdict == "reproduced"
    by_rank = {r.rank: r for r in rec.observed.ranks}
    assert by_rank[1].error_type == "RuntimeError" and "injected error on rank 1 only" in by_rank[1].traceback
    assert by_rank[0].status == "hang" and by_rank[0].stack  # stuck in the next collective: its stack says where
    assert rec.observed.detect_s < TIMEOUT
    assert nxt.verdict == "fix-holds"


def test_symmetric_error_keeps_the_launch(runs):
    records, _ = runs
    rec, nxt = _after(records, "raise_both")
    assert rec.verdict == "reproduced" and rec.observed.note == ""
    launches = {r.observed.note for r in (rec, nxt)}
    assert launches == {""}


def test_leaked_child_is_killed_and_the_launch_replaced(runs):
    rec, nxt = _after(runs[0], "leak_child")
    assert rec.verdict == "fix-holds"  # the cell itself was fine...
    assert "child processes left running" in rec.observed.note  # ...but the launch did not stay dirty
    assert nxt.verdict == "fix-holds"
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "600"]]


def test_leaked_module_over_the_budget_retires_the_launch(runs):
    rec, nxt = _after(runs[0], "leak_module")
    assert rec.verdict == "fix-holds"
    assert "leaked modules hold" in rec.observed.note and "budget 1 MiB" in rec.observed.note
    assert nxt.verdict == "fix-holds"


def test_no_process_of_any_launch_survives(runs):
    records, launcher = runs
    assert launcher._live is None
    # only this launcher's launches (kept by keep_dirs): a session-scoped matrix launcher of another test file may be
    # alive; the hang, exit, segv, one-rank error and both leaks each forced a fresh launch
    ids = {d.name.rsplit("-", 1)[-1] for d in launcher.run_root.glob("launch-*")}
    assert len(ids) == 7
    leftovers = [p for p in psutil.process_iter() if _marked(p, ids)]
    assert leftovers == []


def _marked(proc, ids):
    try:
        return proc.environ().get(procs.MARKER) in ids
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
