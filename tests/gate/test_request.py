"""The gate's arguments (gate/request.py) through its command: what a user mistake prints, in one line, exit 2."""

from __future__ import annotations

import pytest

from fsdp_matrix.gate.cli import main

TOKEN = "s3cr3tTOKEN"
URL = f"https://user:{TOKEN}@example.invalid/peft.git"


class _NoRuns:
    def run(self, *args, **kwargs):
        raise AssertionError("a bad input got past the checks: cells ran")


def _one_line(capsys, argv) -> str:
    code = main(argv, runs=_NoRuns())
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    "pins",
    [
        [f"peft={URL}@main", "peft=/tmp"],
        [f"peft={URL}==1.0"],
        [f"peft @ git+{URL}@main", "peft==0.1.0"],
    ],
    ids=["two-pins", "version", "two-pins-pep508"],
)
def test_defect10_a_usage_error_never_prints_the_pins_credentials(tmp_path, capsys, pins) -> None:
    """Review 2026-11-28, defect 10: ``--pin: give exactly one package under test, got 2: peft=https://user:TOKEN@…``
    on stderr, i.e. in the CI log."""
    argv = [a for pin in pins for a in ("--pin", pin)] + ["--cache", str(tmp_path / "cache")]
    line = _one_line(capsys, argv)
    assert TOKEN not in line and "***@example.invalid" in line, line
