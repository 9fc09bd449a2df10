"""The harness's own tests: the order pytest-xdist hands out their files in."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

HERE = Path(__file__).resolve().parent

SLOW_FIRST = (
    "test_chaos.py",
    "runner/test_launcher.py",
    "test_pytest_plugin.py",
    "export/test_script.py",
    "runner/test_session.py",
    "workload/test_checkpoint.py",
    "test_readme.py",  # the toy-case test runs the docs/matrix checks again in a copy of the repo (~2 min here)
)
"""The files of a minute or more of `nox -s tests` on 2 cores (their module fixtures launch torchrun), longest first."""


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
