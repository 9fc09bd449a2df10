"""The real collaborators' pieces that need no install: pins, compile output, days, and the run contract."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from fsdp_matrix.bisect import Outcome, Untestable
from fsdp_matrix.bisect_run import CellRunner, DatedInstaller, PinnedInstaller, _compiled, days_between, parse_pins
from fsdp_matrix.errors import EnvError
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.records import Observed, Record

FIXTURE = Path(__file__).parent / "fixtures" / "bisect_matrix.yaml"
CELL = "no-split-modules/shape_plain-ws2"


def test_parse_pins() -> None:
    assert parse_pins(["Transformers==4.46.3", "torch==2.13.0"]) == {"transformers": "4.46.3", "torch": "2.13.0"}
    for bad in ("peft>=0.13", "peft", "peft==1,<2"):
        with pytest.raises(EnvError, match="NAME==VERSION"):
            parse_pins([bad])


def test_pins_for_overrides_in_order(tmp_path: Path) -> None:
    combo = load_matrix(FIXTURE).combo("old")
    inst = PinnedInstaller(combo, "peft", tmp_path, {"transformers": "4.47.1", "peft": "0.1.0"})
    pins = inst.pins_for("0.14.0")
    assert pins["peft"] == "0.14.0" and pins["transformers"] == "4.47.1" and pins["accelerate"] == "1.1.1"
    assert inst.harness[0] == "-e" and (Path(inst.harness[1]) / "pyproject.toml").is_file()


def test_compile_output_parsing() -> None:
    out = "accelerate==1.2.0\nfsdp-matrix @ file:///x\ntorch==2.13.0+cpu\nTyping_Extensions==4.12.2 ; python_version < '3.12'\n"
    assert _compiled(out) == {"accelerate": "1.2.0", "torch": "2.13.0+cpu", "typing-extensions": "4.12.2"}


def test_days_between() -> None:
    assert days_between("2024-12-30", "2025-01-02") == ["2024-12-30", "2024-12-31", "2025-01-01", "2025-01-02"]
    with pytest.raises(EnvError):
        days_between("2025-01-02", "2025-01-01")


def test_changes_between_resolutions(tmp_path: Path) -> None:
    dated = DatedInstaller(PinnedInstaller(load_matrix(FIXTURE).combo("old"), "peft", tmp_path))
    assert "torch" not in dated.floating and "peft" in dated.floating
    dated.resolutions = {"d1": {"peft": "0.13.2", "torch": "2.13.0+cpu", "tokenizers": "0.20.3"},
                         "d2": {"peft": "0.14.0", "torch": "2.13.0+cpu", "hf-xet": "1.0.0", "tokenizers": "0.20.3"}}
    assert dated.changes("d1", "d2") == ["hf-xet - -> 1.0.0", "peft 0.13.2 -> 0.14.0"]


def _fake_venv(tmp: Path, body: str) -> Path:
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    script = venv / "bin" / "python"
    script.write_text(f"#!{sys.executable}\nimport json, sys\nargs = sys.argv[1:]\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return venv


def _record_writer(observed: Observed) -> str:
    rec = Record("no-split-modules", "shape_plain-ws2", {"shape": "plain"}, {}, "cpu", 2, {"kind": "ok"}, observed,
                 "reproduced", 1.0)
    return ("assert args[:4] == ['-m', 'fsdp_matrix', 'run', %r], args\n" % CELL
            + "assert args[args.index('--device') + 1] == 'cpu' and args[args.index('--world-size') + 1] == '2'\n"
            + "res = args[args.index('--results') + 1]\n"
            + f"open(res + '/cells.jsonl', 'a').write({json.dumps(rec.to_json())!r} + '\\n')\n")


def test_runner_reads_the_record(tmp_path: Path) -> None:
    obs = Observed("error", "Exception", "Could not find the transformer layer class to wrap in the model.")
    venv = _fake_venv(tmp_path, _record_writer(obs))
    outcome = CellRunner(CELL, workdir=tmp_path).run(venv, "0.13.2")
    assert outcome == Outcome.observed("error", "Exception", obs.error_message)


@pytest.mark.parametrize("status", ["skipped", "env-error"])
def test_runner_cannot_test_a_skipped_or_env_error_cell(tmp_path: Path, status: str) -> None:
    venv = _fake_venv(tmp_path, _record_writer(Observed(status, error_message="no peft")))
    with pytest.raises(Untestable, match=status):
        CellRunner(CELL, workdir=tmp_path).run(venv, "0.13.2")


def test_runner_without_a_record_is_untestable(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path, "sys.stderr.write('ModuleNotFoundError: No module named fsdp_matrix.worker')\nsys.exit(1)")
    with pytest.raises(Untestable, match=r"no record .* \(exit 1\): ModuleNotFoundError.*fsdp_matrix.worker"):
        CellRunner(CELL, workdir=tmp_path).run(venv, "0.13.2")


def test_runner_backstop_timeout_is_a_hang(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path, "import time\ntime.sleep(30)")
    assert CellRunner(CELL, timeout=1, workdir=tmp_path).run(venv, "0.13.2") == Outcome("hang")
