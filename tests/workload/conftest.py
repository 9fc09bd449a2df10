"""Fixtures shared by the workload tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.workload.support import run_two_ranks


@pytest.fixture(scope="session")
def corruption_outcomes(tmp_path_factory):
    """Every scenario of scratch_corruption.py, run once for real on 2 ranks (gloo), by rank: healthy and
    deliberately corrupted models through ``train_and_check`` with a reference (test_corruption.py, test_shards.py)."""
    out = tmp_path_factory.mktemp("corruption")
    proc = run_two_ranks(Path(__file__).with_name("scratch_corruption.py"), str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
