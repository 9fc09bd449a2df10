"""Verification of an env: versions against the pins, and probes that fail as env-errors, never as crashes."""

import sys
import time
from pathlib import Path

import pytest

from fsdp_matrix import envs
from fsdp_matrix.errors import EnvError


def test_version_verification_ignores_build_labels_only():
    installed = {"torch": "2.13.0+cpu", "peft": "0.21.1", "transformers": None}
    assert envs.mismatches(installed, {"torch": "2.13.0"}) == []
    assert envs.mismatches(installed, {"peft": "0.21.2", "transformers": "5.23.0"}) == [
        "peft: pinned 0.21.2, installed 0.21.1",
        "transformers: pinned 5.23.0, installed nothing",
    ]


def test_installed_versions_of_this_interpreter(tmp_path):
    got = envs.installed_versions(sys.executable, ["pytest", "surely-not-installed-pkg"])
    assert got["pytest"] and got["surely-not-installed-pkg"] is None


def fake_python(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "bin" / "python"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def test_missing_interpreter_is_an_env_error_not_a_crash(tmp_path):
    # FileNotFoundError used to escape installed_versions and import_check
    gone = tmp_path / "gone" / "bin" / "python"
    with pytest.raises(EnvError, match="no interpreter"):
        envs.installed_versions(gone, ["peft"])
    assert "no interpreter" in (envs.import_check(gone) or "")
    # a stamped env whose interpreter was removed: prepare reports it
    venv = tmp_path / "gone"
    venv.mkdir()
    envs.write_stamp(venv, ["peft==0.21.2", "device=cpu"], {"peft": "0.21.2"})
    report = envs.prepare(venv, {"peft": "0.21.2"})
    assert not report.ok and "no interpreter" in report.message


def test_a_hanging_interpreter_is_an_env_error_not_a_crash(tmp_path):
    # TimeoutExpired used to escape both probes
    slow = fake_python(tmp_path, "sleep 30")
    start = time.monotonic()
    assert "did not answer within 1s" in (envs.import_check(slow, timeout=1) or "")
    with pytest.raises(EnvError, match="did not answer within 1s"):
        envs.installed_versions(slow, ["peft"], timeout=1)
    assert time.monotonic() - start < 25


def test_an_env_that_pins_trl_must_import_its_trainers():
    from fsdp_matrix.envs.check import DEFAULT_IMPORTS, imports_for

    assert imports_for(["torch", "peft"]) == list(DEFAULT_IMPORTS)
    # `import trl` is lazy: trl 0.8.6 imports without `rich`, its SFTTrainer does not (observed 2026-11-24)
    assert imports_for(["torch", "trl"]) == [*DEFAULT_IMPORTS, "trl.trainer.sft_trainer"]
