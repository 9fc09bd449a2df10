"""``python -m fsdp_matrix``: bad input is one line naming the key and a non-zero exit, never a traceback."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest

from fsdp_matrix.cli import main
from tests.helpers import BAD_INPUTS, matrix_data, write_matrix


@pytest.mark.parametrize("defect", sorted(BAD_INPUTS))
def test_validate_rejects_bad_input_in_one_line(tmp_path, capsys, defect):
    """25."""
    data, names = BAD_INPUTS[defect]
    assert main(["validate", str(write_matrix(tmp_path, data))]) != 0
    err = capsys.readouterr().err
    assert names in err and err.count("\n") == 1, err


def test_validate_accepts_a_good_matrix(tmp_path, capsys):
    assert main(["validate", str(write_matrix(tmp_path, matrix_data()))]) == 0
    assert capsys.readouterr().out.startswith("ok: 1 combos, 1 cases, 3 cells")


def test_run_with_cases_that_match_nothing_says_so(tmp_path, capsys):
    """``--cases`` naming no case selected zero cells and said nothing."""
    matrix = write_matrix(tmp_path, matrix_data())
    rc = main(["run", "--matrix", str(matrix), "--results", str(tmp_path / "r"), "--cases", "lora-requires-grad,typo"])
    err = capsys.readouterr().err
    assert rc != 0 and "--cases" in err and "'typo'" in err and err.count("\n") == 1, err
    assert not (tmp_path / "r" / "launches").exists()  # nothing was launched


def test_export_of_a_cell_whose_repro_is_missing_is_one_line(tmp_path):
    """``export`` printed a raw FileNotFoundError traceback."""
    path = write_matrix(tmp_path, matrix_data())
    path.write_text(path.read_text().replace("repros/lora_requires_grad.py", "repros/gone.py"))
    cmd = [sys.executable, "-m", "fsdp_matrix", "export", "lora-requires-grad/lora-fp32-fsdp2-llama-ws2"]
    cmd += ["--matrix", str(path), "--combo", "current", "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert "repros/gone.py" in proc.stderr


def test_export_of_a_repro_removed_after_loading_is_one_line(tmp_path, capsys, monkeypatch):
    """Past validation: the file disappears between loading matrix.yaml and reading the repro."""
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


CELL = "mixed-dtype/lora-bf16-fsdp2-llama-autocast1-ws2"


def test_explain_prints_every_rule_tried_and_the_one_that_applies(capsys):
    assert main(["explain", CELL, "--combo", "torch2.6"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"cell {CELL} (device cpu, world size 2)"
    assert out[1].startswith("versions (combo torch2.6): torch 2.6.0, peft 0.14.0")
    # the platform skip does not match, and says which specifier; the case's torch rule applies
    assert any(line.startswith("  -  platform.skips[0](fsdp2-no-cpu): versions: torch 2.6.0 not <2.6") for line in out)
    assert any(line.startswith("  => expect[1]: matches (torch 2.6.0 >=2.6,<2.8) -> AssertionError") for line in out)
    assert any(line.startswith("  -  expect[0]: when adapter: 'lora' != 'qlora'") for line in out)
    assert any(line.startswith("  +  platform.signatures[0](fsdp2-no-cpu): matches") for line in out)
    assert "applies: expect[1]: AssertionError: /FSDP expects uniform original parameter dtype but got/" in "\n".join(
        out
    )


def test_explain_names_the_platform_skip_and_the_requirement(capsys):
    assert main(["explain", "dora-sharded-weight/dora-fp32-fsdp2-llama-ws1", "--combo", "torch2.5"]) == 0
    out = capsys.readouterr().out
    assert "  => requires[0]: unmet: needs world size >= 2" in out
    assert "  => platform.skips[0](fsdp2-no-cpu): matches (torch 2.5.1 <2.6)" in out
    assert "requirement: needs world size >= 2, this run has 1: at world size 1 FSDP1 falls back" in out
    assert "applies: platform.skips(fsdp2-no-cpu): skip (FSDP2 has no CPU path" in out


def test_explain_versions_override_the_combo(capsys):
    assert main(["explain", CELL, "--combo", "torch2.6", "--versions", "torch=2.8.0"]) == 0
    out = capsys.readouterr().out
    assert "versions (combo torch2.6, with torch=2.8.0): torch 2.8.0, peft 0.14.0" in out
    assert "applies: expect[10]: ok" in out  # mixed-dtype's fsdp2-ok (the 11th rule)


def test_explain_shows_the_newest_record(tmp_path, capsys):
    from fsdp_matrix import records
    from fsdp_matrix.cells import find_cell
    from fsdp_matrix.expectations import expected_for
    from fsdp_matrix.matrix import load_matrix
    from fsdp_matrix.verdicts import make_record

    matrix = load_matrix()
    cell = find_cell(matrix, CELL)
    versions = matrix.combo("torch2.6").pins.model_dump()
    expected = expected_for(matrix.case(cell.case), cell, versions)
    for message in (
        "'Stream' object has no attribute 'record_event'",
        "FSDP expects uniform original parameter dtype but got",
    ):
        etype = "AttributeError" if "Stream" in message else "AssertionError"
        where = "torch.cuda.streams" if "Stream" in message else "torch.distributed.fsdp._fully_shard._fsdp_param_group"
        observed = records.Observed(status="error", error_type=etype, error_message=message, location=where)
        rec = make_record(cell, expected, observed, versions, 1.0, "torch2.6", "r", {})
        # torch 2.6's record_event error is the platform's signature: skipped, the observed error kept
        assert rec.verdict == ("skipped" if "Stream" in message else "reproduced")
        assert rec.observed.error_message == message
        records.append(tmp_path, rec)
    assert main(["explain", CELL, "--combo", "torch2.6", "--results", str(tmp_path)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("newest record: reproduced (combo torch2.6, run r): expected AssertionError")
    assert main(["explain", CELL, "--combo", "old", "--results", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"newest record: none for this cell in {tmp_path}"
    # a record of this combo made with other versions than its pins says which (it was shown as if it were the pins')
    other = dataclasses.replace(rec, versions={**rec.versions, "peft": "0.20.0"}, finished_at=rec.finished_at + 1)
    records.append(tmp_path, other)
    assert main(["explain", CELL, "--combo", "torch2.6", "--results", str(tmp_path)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("newest record: reproduced (combo torch2.6, run r; recorded with peft 0.20.0, not the pins)")


@pytest.mark.parametrize(
    "argv,names",
    [
        (["explain", "mixed-dtype/no-such-cell-ws2"], "no cell 'mixed-dtype/no-such-cell-ws2'"),
        (["explain", CELL, "--combo", "nope"], "no combo 'nope'"),
        (["explain", CELL, "--versions", "torch"], "--versions: 'torch': expected NAME=VERSION"),
        (["explain", CELL, "--versions", "torch=two"], "--versions: 'torch=two': 'two' is not a version"),
        (["explain", CELL, "--versions", "numpy=2.0"], "--versions: 'numpy=2.0'"),
        (["explain", CELL, "--results", "/nonexistent/dir"], "--results: /nonexistent/dir"),
    ],
)
def test_explain_bad_input_is_one_line(capsys, argv, names):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert names in err and err.count("\n") == 1, err


def test_help_prints_one_line_per_command(capsys):
    """``--help`` printed the command names only, with no line on what each does."""
    from fsdp_matrix.cli import COMMANDS, HELP

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert set(HELP) == set(COMMANDS)
    for name in COMMANDS:
        assert re.search(rf"^  {name} +{re.escape(HELP[name])}$", out, re.M), name


def test_validate_names_the_command_that_brings_the_docs_figures_up_to_date(tmp_path, capsys):
    """A new case left the counts and the cases table behind, and validate said ok."""
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "docs" / "pages").mkdir(parents=True)
    shutil.copy(root / "README.md", tmp_path / "README.md")
    shutil.copy(root / "docs" / "pages" / "cases.md", tmp_path / "docs" / "pages" / "cases.md")
    shutil.copytree(root / "repros", tmp_path / "repros")
    text = (root / "matrix.yaml").read_text()
    (tmp_path / "matrix.yaml").write_text(text)
    assert main(["validate", str(tmp_path / "matrix.yaml")]) == 0
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace(" cases, ", "0 cases, ", 1))
    capsys.readouterr()
    assert main(["validate", str(tmp_path / "matrix.yaml")]) == 1
    err = capsys.readouterr().err
    assert "README.md: counts or cases table differ from matrix.yaml; run `python -m fsdp_matrix docs --write`" in err
