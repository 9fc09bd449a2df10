"""The 2-rank launch helper's verdicts on what a launch left (tests/workload/support.py)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.workload.support import rank_outcomes

ABORT = "terminate called without an active exception\n"


def _proc(rc: int) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(["torchrun"], rc, stdout="", stderr=ABORT)


def test_a_rank_dying_in_teardown_after_writing_is_judged_with_a_warning(tmp_path):
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({"rank": rank}))
    with pytest.warns(UserWarning, match="exited -6 after every rank wrote its outcomes"):
        assert rank_outcomes(_proc(-6), tmp_path) == [{"rank": 0}, {"rank": 1}]


def test_a_rank_dying_before_writing_fails_with_what_the_launch_printed(tmp_path):
    (tmp_path / "rank0.json").write_text("{}")
    with pytest.raises(AssertionError, match=r"(?s)exited -6; rank files written: \['rank0.json'\].*terminate called"):
        rank_outcomes(_proc(-6), tmp_path)
