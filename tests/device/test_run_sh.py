"""run.sh's arguments and its reading of plan.json, with --dry-run: no wheel installed, no cell run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fsdp_matrix.device import plan, prepare

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder(tmp_path):
    """A checkout (the package linked in) with a prepared DIR holding run.sh and a two-call plan."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "fsdp_matrix").symlink_to(REPO / "fsdp_matrix")
    shutil.copy(REPO / "matrix.yaml", root / "matrix.yaml")
    dir_ = root / ".device"
    dir_.mkdir()
    shutil.copy(prepare.RUN_SH, dir_ / "run.sh")
    steps = [
        plan.Step(
            "merge-peft0.13.0", "cells", "peft0.13.0", "seed 002 on 0.13.0", ("merge-device/lora-fp32-llama-ws1",)
        ),
        plan.Step("probe", "probe", "harness", "two ranks on one GPU"),
        plan.Step("cpu-sample", "cells", "base", "a sample", ("a/x-ws1", "b/y-ws1", "c/z-ws1")),
    ]
    calls = [plan.Call(1, ("harness", "base", "peft0.13.0"), ("merge-peft0.13.0", "probe")),
             plan.Call(2, ("harness", "base"), ("cpu-sample",))]  # fmt: skip
    (dir_ / "plan.json").write_text(plan.Plan(steps, calls).to_json())
    return dir_


def run_sh(folder: Path, *args: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    argv = ["bash", str(folder / "run.sh"), "--python", python, *args]
    env = {**os.environ, "FSDP_MATRIX_DEVICE_WORK": str(folder.parent / "work")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def test_dry_run_prints_the_call_s_steps_with_their_sites(folder, tmp_path):
    done = run_sh(folder, "--dry-run", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "2 step(s) on cuda: merge-peft0.13.0, probe" in out
    assert "[step 1/2] merge-peft0.13.0: seed 002 on 0.13.0 (1 cell(s), site peft0.13.0" in out
    sites = folder.parent / "work" / "sites"
    assert f"PYTHONPATH={sites}/peft0.13.0:{sites}/base:{sites}/harness\n" in out  # the site, then those under it
    assert "--world-size 1 --combo gpu-image-peft0.13.0" in out and "merge-device/lora-fp32-llama-ws1" in out
    assert "fsdp_matrix.device.probe --device cuda" in out
    assert not (tmp_path / "out" / "run.log").exists()  # a dry run writes nothing


def test_steps_and_sample_pick_from_any_call(folder, tmp_path):
    done = run_sh(folder, "--dry-run", "--out", str(tmp_path), "--steps", "cpu-sample", "--sample", "2")
    assert done.returncode == 0, done.stderr
    assert "[step 1/1] cpu-sample: a sample (2 cell(s), site base" in done.stdout
    assert "a/x-ws1 b/y-ws1" in done.stdout and "c/z-ws1" not in done.stdout


def test_the_rehearsal_takes_every_step_on_cpu(folder, tmp_path):
    done = run_sh(folder, "--dry-run", "--rehearse", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "3 step(s) on cpu: merge-peft0.13.0, probe, cpu-sample" in done.stdout
    assert "(2 cell(s), site base" in done.stdout  # 2 cells a step unless --all


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bogus"], "run.sh: unknown argument '--bogus'"),
        (["--call", "x", "--out", "o"], "run.sh: --call needs a call number"),
        (["--device", "tpu", "--out", "o"], "run.sh: --device is cpu or cuda"),
        (["--budget", "0", "--out", "o"], "run.sh: --budget needs seconds"),
        (["--dry-run"], "run.sh: --out is required"),
        (["--dry-run", "--out", "o", "--call", "3"], "run.sh: --call 3: the plan has calls 1..2"),
        (["--dry-run", "--out", "o", "--steps", "nope"], "run.sh: --steps nope: no step nope; have merge-peft0.13.0"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2(folder, tmp_path, args, message):
    args = [str(tmp_path / a) if a == "o" else a for a in args]
    done = run_sh(folder, *args)
    assert done.returncode == 2
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr


def test_a_broken_plan_or_a_folder_outside_a_checkout_is_refused(folder, tmp_path):
    (folder / "plan.json").write_text('{"schema": 99}')
    done = run_sh(folder, "--dry-run", "--out", str(tmp_path))
    assert done.returncode == 2 and "not a schema-1 plan" in done.stderr
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(prepare.RUN_SH, lone / "run.sh")
    done = run_sh(lone, "--dry-run", "--out", str(tmp_path))
    assert done.returncode == 2 and "no fsdp-matrix checkout above" in done.stderr
