"""The composite action (action.yml at the repository root): its gate step's script, run as GitHub runs it
(``bash -eo pipefail``), with the inputs a caller gives; actionlint on the docs' example workflow.

The fast test puts a recording ``nox`` first on PATH and checks the command line the script builds. The heavy one
runs the script for real over the toy pull request of tests/gate/support.py: ``nox -s gate`` builds the toy package
at each commit into a step env (the ``old`` combo's pins, from uv's cache), runs its two cells on real 2-rank
launches, and bisects; then a second pull request on the same base reads the base back from the cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict

import pytest
import yaml

from fsdp_matrix.matrix import load_matrix
from tests.gate.support import make_pr_repo, toy_cells, write_toy_matrix
from tests.test_workflows import run_actionlint

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "action.yml"
_CANDIDATES = (ROOT / ".nox" / "_nox_script_mode" / "bin" / "nox", shutil.which("nox"))
NOX = next((str(p) for p in _CANDIDATES if p and Path(p).exists()), None)


def gate_script() -> str:
    steps = yaml.safe_load(ACTION.read_text())["runs"]["steps"]
    return next(step["run"] for step in steps if step.get("id") == "gate")


def run_action(tmp_path: Path, inputs: Dict[str, str], path_first: str = "") -> subprocess.CompletedProcess:
    """The gate step's script with ``inputs`` (INPUT_* as action.yml maps them) and the runner's variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INPUT_", "GITHUB_"))}
    if NOX == str(_CANDIDATES[0]):
        env["NOX_SCRIPT_MODE"] = "none"  # that nox's env already holds the noxfile's script dependencies
    env.update({f"INPUT_{k.upper()}": v for k, v in inputs.items()})
    env.update(
        GITHUB_ACTION_PATH=str(ROOT),
        GITHUB_STEP_SUMMARY=str(tmp_path / "summary.md"),
        GITHUB_OUTPUT=str(tmp_path / "output"),
        RUNNER_TEMP=str(tmp_path),
        GATE_CACHE=str(tmp_path / "cache"),
    )
    if path_first:
        env["PATH"] = path_first + os.pathsep + env.get("PATH", "")
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", gate_script()],
        capture_output=True,
        text=True,
        env=env,
        timeout=1400,
        cwd=tmp_path,
    )


def test_the_gate_step_hands_the_inputs_to_nox_s_gate(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nox").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RUNNER_TEMP/nox-argv"\n')
    (bin_dir / "nox").chmod(0o755)
    inputs = {"package": "peft", "path": "/src/peft", "head": "abc123", "base": "main", "combos": "old,current",
              "cases": "no-split-modules", "args": "--hold transformers==4.46.3 --no-bisect"}  # fmt: skip
    proc = run_action(tmp_path, inputs, str(bin_dir))
    assert proc.returncode == 0, proc.stderr
    argv = (tmp_path / "nox-argv").read_text().splitlines()
    out = str(tmp_path / "fsdp-matrix-gate.json")
    assert argv == [
        "-f", str(ROOT / "noxfile.py"), "-s", "gate", "--",
        "--pin", "peft=/src/peft@abc123", "--cache", str(tmp_path / "cache"), "--json", out,
        "--summary", str(tmp_path / "summary.md"), "--base", "main", "--combos", "old,current",
        "--cases", "no-split-modules", "--hold", "transformers==4.46.3", "--no-bisect",
    ]  # fmt: skip
    assert (tmp_path / "output").read_text() == f"json={out}\n"
    # empty inputs add nothing: the gate's own defaults (merge base with the default branch, newest CPU combo)
    run_action(tmp_path, {"package": "peft", "path": "/src/peft", "head": "HEAD"}, str(bin_dir))
    assert (tmp_path / "nox-argv").read_text().splitlines()[5:] == [
        "--pin", "peft=/src/peft@HEAD", "--cache", str(tmp_path / "cache"), "--json", out,
        "--summary", str(tmp_path / "summary.md"),
    ]  # fmt: skip


def test_the_docs_example_workflow_passes_actionlint(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "pages" / "gate.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```", page, re.M | re.S)
    example = next(b for b in blocks if "fsdp-matrix@v1" in b)
    assert yaml.safe_load(example)["jobs"]["fsdp-gate"]["steps"][-1]["with"]["package"] == "peft"
    path = tmp_path / ".github" / "workflows" / "peft-fsdp.yml"
    path.parent.mkdir(parents=True)
    path.write_text(example)
    proc = run_actionlint(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("gate-action")
    shas = make_pr_repo(root / "toypkg")
    matrix = write_toy_matrix(root, load_matrix().combo("old").pins.model_dump())
    return root, shas, matrix, toy_cells(matrix)


@pytest.mark.heavy  # real step envs and 2-rank launches at five commits: minutes (nox -s heavy)
@pytest.mark.timeout(3000)
@pytest.mark.skipif(NOX is None, reason="the nox command is not on PATH")
def test_the_action_gates_a_toy_pr_for_real_and_reuses_its_base(toy, tmp_path: Path) -> None:
    root, shas, matrix, cells = toy
    inputs = {"package": "toypkg", "path": str(root / "toypkg"), "head": "pr", "combos": "toy",
              "args": f"--matrix {matrix}"}  # fmt: skip
    proc = run_action(tmp_path, inputs, str(Path(NOX).parent))
    print(proc.stdout[-6000:], proc.stderr[-3000:], sep="\n")
    assert proc.returncode == 1, proc.stderr[-3000:]
    data = json.loads((tmp_path / "fsdp-matrix-gate.json").read_text())
    assert (data["base"], data["head"]) == (shas["m0"], shas["p3"])
    changed = {c["cell"]: c for c in data["changed"]}
    fix, quirk = changed[cells["toy-fix"]], changed[cells["toy-quirk"]]
    assert (fix["base"]["verdict"], fix["head"]["verdict"], fix["kind"]) == ("fix-holds", "REGRESSION", "fix-broken")
    assert fix["head"]["outcome"]["error_type"] == "ValueError"
    assert (quirk["base"]["verdict"], quirk["head"]["verdict"]) == ("reproduced", "UNEXPECTED-FIX")
    assert fix["commit"]["sha"] == shas["p2"] and quirk["commit"]["sha"] == shas["p3"]
    summary = (tmp_path / "summary.md").read_text()
    assert "**FAILED**" in summary and f"**{shas['p2'][:10]}** Break behave (#3)" in summary

    # a second pull request on the same base: the base's records are read back, only the head runs
    (tmp_path / "summary.md").unlink()
    proc = run_action(tmp_path, {**inputs, "head": "pr-mended"}, str(Path(NOX).parent))
    print(proc.stdout[-6000:], proc.stderr[-3000:], sep="\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "fsdp-matrix-gate.json").read_text())
    assert f"toy@{shas['m0'][:10]}" in data["reused"]
    assert [(c["cell"], c["kind"], c["commit"]["sha"]) for c in data["changed"]] == [
        (cells["toy-quirk"], "now-trains", shas["p3"])
    ]
    assert "**passed**" in (tmp_path / "summary.md").read_text()
