"""The probe's process handling (its 2-rank parts run in the heavy rehearsal, tests/device/test_rehearsal.py)."""

from __future__ import annotations

import sys

import psutil

from fsdp_matrix.device import probe


def test_a_cut_group_takes_its_children_with_it(tmp_path):
    pid_file = tmp_path / "child.pid"
    # bash starts in milliseconds: its child exists long before the cut, even on a loaded machine
    script = f"sleep 60 & echo $! > {pid_file}; wait"
    assert probe.run_group(["bash", "-c", script], seconds=5) is None
    child = int(pid_file.read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_cut_group_is_gone_when_the_call_returns_not_only_its_leader(tmp_path, monkeypatch):
    """The leader (bash) ends at SIGTERM; a child that ignores SIGTERM outlived the call (seen failing before the fix:
    the call returned as soon as the leader ended, the child still running)."""
    monkeypatch.setattr(probe, "TERM_GRACE_S", 1.0)
    pid_file = tmp_path / "child.pid"
    script = f"(trap '' TERM; sleep 60) & echo $! > {pid_file}; wait"
    assert probe.run_group(["bash", "-c", script], seconds=2) is None
    child = int(pid_file.read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_an_exit_code_comes_back():
    assert probe.run_group([sys.executable, "-c", "raise SystemExit(3)"], seconds=30) == 3


def test_nccl_parts_are_not_run_on_cpu(tmp_path):
    facts = probe.facts("cpu", tmp_path, ["nccl", "nccl-hostid"])
    assert [p["launch"] for p in facts["parts"]] == ["not run: NCCL needs CUDA"] * 2
    assert facts["device"] == "cpu" and facts["torch"]
