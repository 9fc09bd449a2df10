"""Hypothesis over the gate's arguments: a valid argument list with one malformed change gives one line, exit 2
and no traceback, before any cell runs (runs are faked: an example that got past every check fails loudly)."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import List

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from fsdp_matrix import options
from fsdp_matrix.gate import flow
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.usage import positive_seconds
from tests.argfuzz import FUZZ, assert_one_line_error, tokens
from tests.gate.support import make_pr_repo, write_toy_matrix

OPTIONS = ("--pin", "--base", "--combos", "--cases", "--world-size", "--timeout", "--device")


class _NoRuns:
    def __init__(self, *args, **kwargs) -> None:
        raise AssertionError("an example got past every check: the gate would have run cells")


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("gate-fuzz")
    make_pr_repo(root / "toypkg")
    return root, write_toy_matrix(root, load_matrix().combo("old").pins.model_dump())


def _resolves(repo: Path, ref: str) -> bool:
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                          capture_output=True, text=True)  # fmt: skip
    return proc.returncode == 0


def _valid(option: str, value: str, repo: Path) -> bool:
    """Whether ``value`` is, after all, a good value of ``option`` for the toy (then the example is not malformed)."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    if option == "--base":
        return bool(value) and "\x00" not in value and (_resolves(repo, value) or _resolves(repo, f"origin/{value}"))
    if option == "--combos":
        return set(items) <= {"toy"}
    if option == "--cases":
        return set(items) <= {"toy-fix", "toy-quirk"}
    if option == "--device":
        return value in ("cpu", "cuda")
    try:
        options.check("world_size", value) if option == "--world-size" else positive_seconds(value)
    except (options.OptionError, argparse.ArgumentTypeError):
        return False
    return option in ("--world-size", "--timeout")


@FUZZ
@given(option=st.sampled_from(OPTIONS), value=tokens)
def test_one_malformed_argument_is_one_line_and_exit_2(toy, monkeypatch, tmp_path, option: str, value: str) -> None:
    root, matrix = toy
    monkeypatch.setattr(flow, "LaunchCellRuns", _NoRuns)
    monkeypatch.chdir(tmp_path)  # a relative --pin path must not land in a git checkout
    assume(not _valid(option, value, root / "toypkg"))
    args = {"--pin": f"toypkg={root / 'toypkg'}@pr", "--combos": "toy", "--matrix": str(matrix)}
    args["--cache"] = str(tmp_path / "cache")
    args[option] = value
    argv: List[str] = ["gate"] + [w for k, v in args.items() for w in (k, v)]
    line = assert_one_line_error(argv)
    assert line.startswith(("fsdp-matrix gate: ", "fsdp_matrix gate: ")), line
