"""Fixtures shared by the workload tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workload.support import rank_outcomes, run_two_ranks


@pytest.fixture(scope="session")
def corruption_outcomes(tmp_path_factory):
    """Every scenario of scratch_corruption.py, run once for real on 2 ranks (gloo), by rank: healthy and
    deliberately corrupted models through ``train_and_check`` with a reference (test_corruption.py, test_shards.py)."""
    out = tmp_path_factory.mktemp("corruption")
    proc = run_two_ranks(Path(__file__).with_name("scratch_corruption.py"), str(out))
    return rank_outcomes(proc, out)
