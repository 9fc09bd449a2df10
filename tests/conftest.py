"""The harness's own tests: the order pytest-xdist hands out their files in."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

HERE = Path(__file__).resolve().parent

SLOW_FIRST = (
    "test_readme.py",  # the toy-case test runs the docs/matrix checks again in a copy of the repo
    "export/test_script.py",
    "test_chaos.py",
    "test_standalone.py",
    "test_triage.py",
    "workload/test_units.py",
    "triage/test_match.py",
    "test_pytest_plugin.py",
    "check/test_check.py",
    "workload/test_checkpoint.py",
    "envs/test_sources.py",
    "workload/test_collectives.py",
    "test_cli.py",
    "runner/test_launcher.py",
)
"""The files of 20 s or more of `nox -s tests` on 2 workers (their module fixtures launch torchrun, or they run
subprocesses), longest first: the sums of ``--durations=0`` per file, measured 2026-11-29."""


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    """The slow files first: ``--dist loadfile`` hands files to the workers in collection order, and a long file
    handed out last keeps one worker busy alone after the other has run out (observed 2026-11-27 from a fresh clone:
    the last 2% of the harness's tests, the chaos test's file among them, took 3.5 of its 11 minutes)."""
    first = {name: i for i, name in enumerate(SLOW_FIRST)}

    def rank(item: pytest.Item) -> int:
        try:
            return first.get(Path(item.path).relative_to(HERE).as_posix(), len(first))
        except ValueError:  # an item outside tests/
            return len(first)

    items.sort(key=rank)  # stable: every other file keeps its place and its order
