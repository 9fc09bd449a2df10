"""fsdp_matrix.sessions without nox: the pieces a session runs before any env is built."""

from __future__ import annotations

import types

import pytest

from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.sessions import with_releases


def test_a_matrix_run_pins_a_release_no_combo_pins(capsys):
    """``nox -s matrix -- --pin accelerate==0.34.2`` was refused: only source pins were taken."""
    session = types.SimpleNamespace(name="matrix(old)")
    old = load_matrix().combo("old")
    pinned = with_releases(session, old, ["accelerate==0.34.2"])
    assert pinned.pins.accelerate == "0.34.2" and pinned.id == "old" and pinned.pins.peft == old.pins.peft
    assert with_releases(session, old, []) is old
    with pytest.raises(SystemExit) as leaves:
        with_releases(session, old, ["accelerate==0.34.*"])
    assert leaves.value.code == 2 and "exact version" in capsys.readouterr().err
