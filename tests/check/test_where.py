"""Where the files are read: the installed libraries when they are the versions given, else the built env of the
combo whose pins are those versions, else the installed ones with one line saying so."""

from __future__ import annotations

from pathlib import Path

from fsdp_matrix.check import where
from fsdp_matrix.installed import installed_versions
from fsdp_matrix.matrix import load_matrix

MATRIX = load_matrix(None, check_repros=False)
QLORA = Path(__file__).resolve().parent / "peft_qlora"


def _fake_env(root: Path, name: str) -> Path:
    python = root / ".nox" / name / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    return python


def test_the_env_of_the_combo_whose_pins_are_the_versions_given(tmp_path, monkeypatch):
    monkeypatch.setattr(where, "REPO", tmp_path)
    wanted = MATRIX.combo("peft0.15-tf4.51").pins.model_dump()
    assert where.combo_env(MATRIX, wanted) is None  # not built
    python = _fake_env(tmp_path, "matrix-peft0.15-tf4.51")
    assert where.combo_env(MATRIX, wanted) == python
    assert where.combo_env(MATRIX, {**wanted, "peft": "0.15.1"}) is None  # no combo pins that peft


def test_without_a_built_env_the_installed_libraries_read_and_say_so(tmp_path, monkeypatch):
    monkeypatch.setattr(where, "REPO", tmp_path)
    wanted = MATRIX.combo("peft0.15-tf4.51").pins.model_dump()
    read = where.read(MATRIX, {"peft": QLORA / "adapter_config.json"}, wanted)
    have = installed_versions(where.READ_PACKAGES)
    assert read.where.startswith(f"read with the installed libraries (accelerate {have['accelerate']}")
    assert "not accelerate 1.6.0, transformers 4.51.3, peft 0.15.2" in read.where
    assert [r.kind for r in read.readings] == ["peft"] and read.readings[0].versions["peft"] == have["peft"]
