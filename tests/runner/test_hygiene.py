"""Between cells: a stray child that exits on its own while being cleaned up is not the rank's death."""

from __future__ import annotations

import gc
import subprocess

import psutil
import pytest

from fsdp_matrix.runner import hygiene


@pytest.fixture
def rank_hygiene():
    h = hygiene.Hygiene()
    yield h
    gc.unfreeze()  # Hygiene freezes what is alive (a rank's imports); this test process is not a rank


def test_child_that_exits_before_it_is_killed_is_reported_not_fatal(rank_hygiene, monkeypatch):
    """Defect 8: ``child.kill()`` raised NoSuchProcess for a child that had already exited, and the rank exited 1."""
    child = subprocess.Popen(["sleep", "30"])
    gone = psutil.Process(child.pid)
    child.kill()
    child.wait()  # reaped: the psutil handle now names a process that no longer exists

    class _Me:
        def children(self, recursive=False):
            return [gone]

    real = psutil.Process
    monkeypatch.setattr(psutil, "Process", lambda *a: _Me() if not a else real(*a))
    state = rank_hygiene.check(barrier_timeout_s=1)
    assert any("child processes left running" in p for p in state["problems"])


HOSTILE_STATE = ["patch_adamw", "warn_error", "sys_path", "anomaly", "matmul", "set_env", "chdir"]


def test_a_cell_that_leaves_global_state_changed_never_taints_the_next(tmp_path):
    """Issue 17 defect 3: a monkeypatched ``torch.optim.AdamW.step`` or ``warnings.simplefilter("error")`` (and
    sys.path, anomaly mode, matmul precision, os.environ, cwd) left by one cell flipped the next healthy cell. The
    next cell must run in a process without the change, and the changing cell's record says the ranks restarted."""
    from tests.runner.hostile import run_sequence

    faults = [f for hostile in HOSTILE_STATE for f in (hostile, "probe")]
    recs = run_sequence(tmp_path, faults)
    probes = [(prev, r) for prev, f, r in zip(faults, faults[1:], recs[1:]) if f == "probe"]
    assert [(prev, r.verdict) for prev, r in probes] == [(prev, "fix-holds") for prev, _ in probes], [
        r.line for _, r in probes
    ]
    for fault, rec in zip(faults, recs):
        if fault != "probe":
            assert "global state changed by the cell" in rec.observed.note, (fault, rec.observed.note)
            assert "ranks restarted before the next cell" in rec.observed.note, (fault, rec.observed.note)


def test_torchs_own_lazy_decoration_is_no_change_but_a_cells_patch_is():
    # the first AdamW hooks AdamW.step and pulls in dynamo, which wraps torch.manual_seed: torch working as designed
    # (taken for a patch, it restarted the ranks after every cell that trains); a cell's own replacement still counts
    import torch

    from fsdp_matrix.runner import hygiene

    before = hygiene.public_attributes()
    param = torch.nn.Parameter(torch.zeros(2))
    torch.optim.AdamW([param]).step()
    assert hygiene._attribute_changes(before, hygiene.public_attributes()) == []
    saved = torch.optim.AdamW.__dict__.get("step")
    try:
        torch.optim.AdamW.step = lambda self, closure=None: None
        assert hygiene._attribute_changes(before, hygiene.public_attributes()) == ["torch.optim.AdamW.step"]
    finally:
        if saved is None:
            del torch.optim.AdamW.step
        else:
            torch.optim.AdamW.step = saved
