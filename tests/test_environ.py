"""fsdp_matrix.environ: variables set for a block and put back as they were, set or unset, on return or raise."""

import os

import pytest

from fsdp_matrix import environ


def test_sets_and_unsets_for_the_block_then_restores(monkeypatch):
    monkeypatch.setenv("FSDP_MATRIX_T_SET", "before")
    monkeypatch.delenv("FSDP_MATRIX_T_NEW", raising=False)
    with environ.patched({"FSDP_MATRIX_T_SET": None, "FSDP_MATRIX_T_NEW": "during"}):
        assert "FSDP_MATRIX_T_SET" not in os.environ
        assert os.environ["FSDP_MATRIX_T_NEW"] == "during"
    assert os.environ["FSDP_MATRIX_T_SET"] == "before"
    assert "FSDP_MATRIX_T_NEW" not in os.environ


def test_restores_when_the_block_raises(monkeypatch):
    monkeypatch.setenv("FSDP_MATRIX_T_SET", "before")
    with pytest.raises(RuntimeError):
        with environ.patched({"FSDP_MATRIX_T_SET": "during"}):
            raise RuntimeError("boom")
    assert os.environ["FSDP_MATRIX_T_SET"] == "before"


def test_a_variable_the_block_itself_changes_is_restored_too(monkeypatch):
    monkeypatch.delenv("FSDP_MATRIX_T_NEW", raising=False)
    with environ.patched({"FSDP_MATRIX_T_NEW": "during"}):
        os.environ["FSDP_MATRIX_T_NEW"] = "changed in the block"
    assert "FSDP_MATRIX_T_NEW" not in os.environ
