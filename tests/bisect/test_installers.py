"""The installers' pieces that need no install: pins, compile output, days, changes between days."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fsdp_matrix.bisect.installers import DatedInstaller, PinnedInstaller, _compiled, days_between, parse_pins
from fsdp_matrix.errors import EnvError
from fsdp_matrix.matrix import load_matrix

FIXTURE = Path(__file__).parent / "fixtures" / "bisect_matrix.yaml"
CELL = "no-split-modules/shape_plain-ws2"


def test_parse_pins() -> None:
    assert parse_pins(["Transformers==4.46.3", "torch==2.13.0"]) == {"transformers": "4.46.3", "torch": "2.13.0"}
    for bad in ("peft>=0.13", "peft", "peft==1,<2"):
        with pytest.raises(EnvError, match="NAME==VERSION"):
            parse_pins([bad])


def test_defect6_parse_pins_refuses_a_package_given_twice_and_inexact_versions() -> None:
    """The last duplicate won silently, and ``peft==0.14.*`` passed as a pin."""
    for twice in (["peft==0.14.0", "peft==0.13.2"], ["PEFT==0.13.2", "Peft==0.14.0"]):
        with pytest.raises(EnvError, match="peft given twice"):
            parse_pins(twice)
    for inexact in ("peft==0.14.*", "peft==abc"):
        with pytest.raises(EnvError, match="exact version"):
            parse_pins([inexact])


def test_pins_for_overrides_in_order(tmp_path: Path) -> None:
    combo = load_matrix(FIXTURE).combo("old")
    inst = PinnedInstaller(combo, "peft", tmp_path, {"transformers": "4.47.1", "peft": "0.1.0"})
    pins = inst.pins_for("0.14.0")
    assert pins["peft"] == "0.14.0" and pins["transformers"] == "4.47.1" and pins["accelerate"] == "1.1.1"
    assert inst.harness[0] == "-e" and (Path(inst.harness[1]) / "pyproject.toml").is_file()


def test_compile_output_parsing() -> None:
    out = (
        "accelerate==1.2.0\nfsdp-matrix @ file:///x\ntorch==2.13.0+cpu\n"
        "Typing_Extensions==4.12.2 ; python_version < '3.12'\n"
    )
    assert _compiled(out) == {"accelerate": "1.2.0", "torch": "2.13.0+cpu", "typing-extensions": "4.12.2"}


def test_days_between() -> None:
    assert days_between("2024-12-30", "2025-01-02") == ["2024-12-30", "2024-12-31", "2025-01-01", "2025-01-02"]
    with pytest.raises(EnvError):
        days_between("2025-01-02", "2025-01-01")


def test_changes_between_resolutions(tmp_path: Path) -> None:
    dated = DatedInstaller(PinnedInstaller(load_matrix(FIXTURE).combo("old"), "peft", tmp_path))
    assert "torch" not in dated.floating and "peft" in dated.floating
    dated.resolutions = {
        "d1": {"peft": "0.13.2", "torch": "2.13.0+cpu", "tokenizers": "0.20.3"},
        "d2": {"peft": "0.14.0", "torch": "2.13.0+cpu", "hf-xet": "1.0.0", "tokenizers": "0.20.3"},
    }
    assert dated.changes("d1", "d2") == ["hf-xet - -> 1.0.0", "peft 0.13.2 -> 0.14.0"]


def test_defect12_the_checkout_is_found_from_any_working_directory(tmp_path: Path, monkeypatch) -> None:
    """Since installers.py moved into bisect/, its parent's parent is the package dir, so
    upgrade, bisect and the nightly's upgrade check worked only from the repo root (the cwd fallback)."""
    from fsdp_matrix.bisect.installers import harness_root

    monkeypatch.chdir(tmp_path)
    assert harness_root() == Path(__file__).resolve().parents[2]
    assert PinnedInstaller(load_matrix(FIXTURE).combo("old"), "peft", tmp_path).harness[1] == str(harness_root())


def test_defect7_a_cached_env_whose_interpreter_link_dangles_is_recreated_and_reinstalled(tmp_path, capsys) -> None:
    """Review 2026-11-28, defect 7: a restored cache whose ``bin/python`` points at an interpreter that moved (a
    setup-python patch release) was taken as current; ``uv venv`` then refused the existing folder and every gate
    on that base said "did not build or import". It is recreated (``uv venv --clear``), and its stamp goes with it,
    so the install runs again; one line says why."""
    from fsdp_matrix.bisect.installers import _create_venv
    from fsdp_matrix.envs.build import STAMP

    venv = tmp_path / "env-x"
    _create_venv(venv, sys.executable)
    (venv / STAMP).write_text('{"hash": "current"}')
    python = venv / "bin" / "python"
    python.unlink()
    python.symlink_to(tmp_path / "gone" / "python3.11")  # the link dangles
    capsys.readouterr()
    _create_venv(venv, sys.executable)
    ran = subprocess.run([str(python), "-c", "print(1)"], capture_output=True, text=True)
    assert ran.stdout.strip() == "1" and not (venv / STAMP).exists()
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and "does not run" in said[0] and "recreating" in said[0], said
