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
