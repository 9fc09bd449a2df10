"""``python -m fsdp_matrix``: bad input is one line naming the key and a non-zero exit, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fsdp_matrix.cli import main
from tests.helpers import BAD_INPUTS, matrix_data, write_matrix


@pytest.mark.parametrize("defect", sorted(BAD_INPUTS))
def test_validate_rejects_bad_input_in_one_line(tmp_path, capsys, defect):
    """Defects 18-23, 25."""
    data, names = BAD_INPUTS[defect]
    assert main(["validate", str(write_matrix(tmp_path, data))]) != 0
    err = capsys.readouterr().err
    assert names in err and err.count("\n") == 1, err


def test_validate_accepts_a_good_matrix(tmp_path, capsys):
    assert main(["validate", str(write_matrix(tmp_path, matrix_data()))]) == 0
    assert capsys.readouterr().out.startswith("ok: 1 combos, 1 cases, 3 cells")


def test_run_with_cases_that_match_nothing_says_so(tmp_path, capsys):
    """Defect 24: ``--cases`` naming no case selected zero cells and said nothing."""
    matrix = write_matrix(tmp_path, matrix_data())
    rc = main(["run", "--matrix", str(matrix), "--results", str(tmp_path / "r"), "--cases", "lora-requires-grad,typo"])
    err = capsys.readouterr().err
    assert rc != 0 and "--cases" in err and "'typo'" in err and err.count("\n") == 1, err
    assert not (tmp_path / "r" / "launches").exists()  # nothing was launched


def test_export_of_a_cell_whose_repro_is_missing_is_one_line(tmp_path):
    """Defect 26: ``export`` printed a raw FileNotFoundError traceback."""
    path = write_matrix(tmp_path, matrix_data())
    path.write_text(path.read_text().replace("repros/lora_requires_grad.py", "repros/gone.py"))
    cmd = [sys.executable, "-m", "fsdp_matrix", "export", "lora-requires-grad/lora-fp32-fsdp2-llama-ws2"]
    cmd += ["--matrix", str(path), "--combo", "current", "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert "repros/gone.py" in proc.stderr


def test_export_of_a_repro_removed_after_loading_is_one_line(tmp_path, capsys, monkeypatch):
    """Defect 26, past validation: the file disappears between loading matrix.yaml and reading the repro."""
    from fsdp_matrix.export import cli as export_cli

    path = write_matrix(tmp_path, matrix_data())
    real_load = export_cli.load_matrix

    def load_then_remove(*args, **kwargs):
        matrix = real_load(*args, **kwargs)
        (tmp_path / "repros" / "lora_requires_grad.py").unlink()
        return matrix

    monkeypatch.setattr(export_cli, "load_matrix", load_then_remove)
    rc = main(["export", "lora-requires-grad/lora-fp32-fsdp2-llama-ws2", "--matrix", str(path), "--combo", "current"])
    err = capsys.readouterr().err
    assert rc != 0 and "lora_requires_grad.py" in err and err.count("\n") == 1, err
