"""What the gate shows of a cell at one commit (gate/runs.py)."""

from __future__ import annotations

from fsdp_matrix.gate.runs import Seen


def test_defect15_a_clipped_reason_keeps_the_missing_name() -> None:
    """Review 2026-11-28: the reason clipped at 100 characters read ``ReproError: cannot load repro <path>/
    no_split_modules.py: ImportErro…``: the name the pull request removed was cut."""
    path = "/home/runner/work/fsdp-matrix/fsdp-matrix/repros/no_split_modules.py"
    reason = (
        f"ReproError: cannot load repro {path}: ImportError: cannot import name 'fsdp_auto_wrap_policy' from 'peft'"
    )
    why = Seen(None, reason).why
    assert "ReproError" in why and "cannot import name 'fsdp_auto_wrap_policy' from 'peft'" in why, why
