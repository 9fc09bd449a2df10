"""The commit bisect on a toy package's git repository (tests/sources_support.py), for real: each step builds the
toy package from a clean snapshot of one commit into a step env (the ``old`` combo's pins, from uv's cache) and runs
a real 2-rank cell that imports it, through the same ``bisect --git`` path as peft. A real peft clone is never
needed; the peft demonstration (tests at the end) skips when FSDP_MATRIX_PEFT_CLONE is not a clone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from fsdp_matrix.bisect.commits import describe, first_parent_line
from fsdp_matrix.bisect.search import install_bound
from fsdp_matrix.cells import expand
from fsdp_matrix.matrix import load_matrix
from tests.sources_support import make_toy_repo

ROOT = Path(__file__).resolve().parents[2]
TOY_CASE = '''"""Toy case: calls the toy package the commit bisect builds from source."""

import toypkg

CASE = "toy-bug"


def run(params, ctx):
    return {"answer": toypkg.behave()}
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("commits")
    shas = make_toy_repo(root / "toypkg")
    old = load_matrix().combo("old")
    matrix = {
        "combos": [{"id": "toy", "pins": old.pins.model_dump(), "tags": ["test"]}],
        "cases": [
            {
                "id": "toy-bug",
                "title": "the toy package's bug",
                "report": "tests/sources_support.py",
                "repro": "toy_case.py",
                "grids": [{"toy": ["plain", "twin"]}],
                "expect": [{"error": {"type": "RuntimeError", "match": "toy bug present"}, "source": "the toy repo"}],
            }
        ],
    }
    (root / "matrix.yaml").write_text(yaml.safe_dump(matrix))
    (root / "toy_case.py").write_text(TOY_CASE)
    cells = [c.key for c in expand(load_matrix(root / "matrix.yaml"), "cpu", 2)]
    assert len(cells) == 2
    return root, shas, cells


def test_first_parent_line_starts_at_the_merge_base(toy) -> None:
    root, shas, _ = toy
    repo = root / "toypkg"
    base, line = first_parent_line(repo, "v0.1.1", "v0.2.0")
    assert base == shas["c0"]
    assert line == [shas[f"c{i}"] for i in range(6)]
    commits = describe(repo, [shas["c4"], shas["c0"]])
    assert [(c.sha, c.subject, c.pr) for c in commits] == [
        (shas["c4"], "Fix the toy bug (#42)", 42),
        (shas["c0"], "Toy package (#1)", 1),
    ]
    assert commits[0].date.startswith("2024-01-01T00:00:00")


def _bisect(root: Path, cells: List[str], good: str, bad: str, out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "fsdp_matrix", "bisect", *cells, "--package", "toypkg", "--git", str(root / "toypkg")]
    cmd += ["--good", good, "--bad", bad, "--combo", "toy", "--matrix", str(root / "matrix.yaml")]
    cmd += ["--cache", str(root / "cache"), "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    print(proc.stdout, proc.stderr[-3000:], sep="\n")
    return proc


@pytest.mark.bisect
@pytest.mark.heavy  # the commit bisect over the toy repo, then a rerun that reuses it: minutes (nox -s heavy)
@pytest.mark.timeout(1300)
def test_commit_bisect_finds_the_fixing_commit_and_skips_one_that_does_not_build(toy) -> None:
    root, shas, cells = toy
    out = root / "bisect.json"
    proc = _bisect(root, cells, "v0.1.1", "v0.2.0", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    # GOOD (v0.1.1) is off the line: it is tested, then the merge base c0, which behaves like it
    assert result["merge_base"] == shas["c0"] and result["commits"] == 6
    tested: Dict[str, dict] = {s["commit"]: s for s in result["steps"]}
    order: List[str] = [s["commit"] for s in result["steps"]]
    assert order[:2] == [shas["v0.1.1"], shas["c0"]]
    for name in ("v0.1.1", "c0"):
        assert tested[shas[name]]["outcome"]["error_type"] == "RuntimeError"
    # c3 does not build: skipped, as git bisect skip would; the answer names it as possibly the change
    assert not tested[shas["c3"]]["installed"] and "install failed" in tested[shas["c3"]]["reason"]
    assert result["first_changed"] == shas["c4"] and result["last_unchanged"] == shas["c2"]
    assert result["untestable"] == [shas["c3"]]
    assert result["commit"] == {
        "sha": shas["c4"],
        "subject": "Fix the toy bug (#42)",
        "date": "2024-01-01T00:00:00+00:00",
        "pr": 42,
    }
    assert tested[shas["c4"]]["outcome"]["status"] == "ok"
    assert result["installs"] <= install_bound(6) + 1 and result["failed_installs"] == 1  # +1: GOOD off the line
    assert f"first changed commit: {shas['c4']} 'Fix the toy bug (#42)'" in proc.stdout
    assert "(PR #42)" in proc.stdout and "<- first changed" in proc.stdout
    # both cells changed at the same commit and shared every step: one install per commit, both cells in its launch
    assert [result["cells"][c]["first_changed"] for c in cells] == [shas["c4"], shas["c4"]]
    assert all(set(s["outcomes"]) == set(cells) for s in result["steps"] if s["installed"])

    # run again: every step env and every record is reused, nothing is installed or launched
    again = _bisect(root, cells, "v0.1.1", "v0.2.0", root / "again.json")
    assert again.returncode == 0
    again_json = json.loads((root / "again.json").read_text())
    assert (again_json["installs"], again_json["failed_installs"]) == (0, 1)  # c3 is tried again: it still fails
    assert "launch starting" not in again.stdout + again.stderr


@pytest.mark.bisect
@pytest.mark.heavy  # two real step installs and launches (nox -s heavy)
@pytest.mark.timeout(900)
def test_a_merge_base_that_does_not_behave_like_good_stops_the_bisect(toy) -> None:
    root, shas, cells = toy
    out = root / "stop.json"
    # v0.1.2 has the fix backported; the merge base has the bug
    proc = _bisect(root, cells[:1], "v0.1.2", "v0.2.0", out)
    assert proc.returncode == 1
    assert f"{cells[0]}: the merge base {shas['c0'][:10]} does not behave like v0.1.2" in proc.stdout
    result = json.loads(out.read_text())
    assert result["first_changed"] is None and [s["commit"] for s in result["steps"]] == [shas["v0.1.2"], shas["c0"]]


def test_refuses_torch_from_source_in_one_line(toy) -> None:
    root, _, cells = toy
    proc = subprocess.run(
        [sys.executable, "-m", "fsdp_matrix", "bisect", cells[0], "--package", "torch", "--git", str(root / "toypkg")]
        + ["--good", "v0.1.0", "--bad", "v0.2.0", "--matrix", str(root / "matrix.yaml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "fsdp-matrix bisect: --package torch: building torch from source is refused (hours of C++/CUDA build)"
    ]


PEFT_CLONE = Path(os.environ.get("FSDP_MATRIX_PEFT_CLONE", "/work/peft-clone"))


@pytest.mark.skipif(
    not (PEFT_CLONE / ".git").exists(),
    reason=f"no peft clone at {PEFT_CLONE} (set FSDP_MATRIX_PEFT_CLONE to a git clone of huggingface/peft)",
)
def test_peft_clone_line_from_v0_13_2_to_v0_14_0_holds_pr_2167() -> None:
    base, line = first_parent_line(PEFT_CLONE, "v0.13.2", "v0.14.0")
    subjects = {c.pr: c.sha for c in describe(PEFT_CLONE, line)}
    assert 2167 in subjects and base == line[0]


def test_held_sources_are_installed_with_every_commit_and_name_the_env(toy, tmp_path) -> None:
    """``--pin NAME=SOURCE`` (what the nightly passes for the packages it does not bisect): every step installs that
    source at its one commit next to the commit under test, and the env's name holds both commits."""
    from fsdp_matrix.bisect.commits import CommitInstaller
    from fsdp_matrix.bisect.search import Prepared
    from fsdp_matrix.envs.sources import SourcePin, resolve_pins

    root, shas, _ = toy
    repo = root / "toypkg"
    asked = []

    class Base:
        combo = load_matrix(root / "matrix.yaml").combo("toy")
        overrides = {"torch": "2.13.0"}

        def install(self, pins, extra, sources=None, imports=()):
            asked.append((dict(pins), {n: s.commit for n, s in (sources or {}).items()}, tuple(imports)))
            return Prepared(tmp_path)

    held = resolve_pins([f"accelerate={repo}@v0.1.0"], tmp_path / "src")
    installer = CommitInstaller(Base(), SourcePin("toypkg", str(repo)), tmp_path / "src", held=held)
    assert installer.prepare(shas["c4"]).ok and installer.prepare(shas["c5"]).ok
    (pins4, sources4, imports), (pins5, sources5, _) = asked
    assert sources4 == {"accelerate": shas["c0"], "toypkg": shas["c4"]} and sources5["toypkg"] == shas["c5"]
    assert pins4["accelerate"] == pins5["accelerate"] == f"git-{shas['c0'][:20]}"
    assert pins4["toypkg"] == f"git-{shas['c4'][:12]}" and pins4["torch"] == "2.13.0" and "toypkg" in imports


def test_a_held_source_of_the_bisected_package_is_refused_in_one_line(toy) -> None:
    root, _, cells = toy
    proc = subprocess.run(
        [sys.executable, "-m", "fsdp_matrix", "bisect", cells[0], "--package", "toypkg", "--git", str(root / "toypkg")]
        + ["--good", "v0.1.0", "--bad", "v0.2.0", "--matrix", str(root / "matrix.yaml"), "--combo", "toy"]
        + ["--pin", f"toypkg={root / 'toypkg'}@v0.1.0", "--cache", str(root / "refused-cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "fsdp-matrix bisect: --pin toypkg: toypkg is the package being bisected (--good .. --bad)"
    ]


def test_the_json_answer_shows_the_repository_without_its_credentials() -> None:
    """``bisect --git 'http://user:TOKEN@host/peft.git'`` wrote the token into ``--json``'s ``repo``."""
    from types import SimpleNamespace

    from fsdp_matrix.bisect.commits import CommitRequest, Found, to_json

    req = CommitRequest(["c"], "peft", "http://user:s3cr3tTOKEN@127.0.0.1:8765/peft.git", "a", "b")
    line = SimpleNamespace(
        cells=["c"], request=req, installer=SimpleNamespace(base=SimpleNamespace(log=[])), combo="current",
        package="peft", merge_base="a" * 40, line=["a" * 40],
    )  # fmt: skip
    data = to_json(line, Found(), {}, 0.0)  # type: ignore[arg-type]
    assert data["repo"] == "http://***@127.0.0.1:8765/peft.git"
    assert "s3cr3tTOKEN" not in json.dumps(data, default=str)


def test_a_held_working_tree_names_the_step_env_by_its_dirty_hash_too(toy, tmp_path) -> None:
    """Two states of a held working tree named the same step env (the dirty hash was cut off), so a re-run after an
    edit answered from the records of the old tree."""
    from dataclasses import replace

    from fsdp_matrix.bisect.commits import CommitInstaller
    from fsdp_matrix.bisect.search import Prepared
    from fsdp_matrix.envs.sources import SourcePin, resolve_pins

    root, shas, _ = toy
    repo = root / "toypkg"
    asked = []

    class Base:
        combo = load_matrix(root / "matrix.yaml").combo("toy")
        overrides: Dict[str, str] = {}

        def install(self, pins, extra, sources=None, imports=()):
            asked.append(dict(pins))
            return Prepared(tmp_path)

    held = resolve_pins([f"accelerate={repo}@v0.1.0"], tmp_path / "src")["accelerate"]
    for dirty in ("1" * 16, "2" * 16):
        pin = SourcePin("toypkg", str(repo))
        held_now = {"accelerate": replace(held, dirty=dirty)}
        assert CommitInstaller(Base(), pin, tmp_path / "src", held=held_now).prepare(shas["c4"]).ok
    assert asked[0]["accelerate"] != asked[1]["accelerate"]
    assert asked[0]["toypkg"] == asked[1]["toypkg"]


def _commit_main(root: Path, cells: List[str], *extra: str) -> int:
    from fsdp_matrix.bisect import commits

    argv = [cells[0], "--package", "toypkg", "--git", str(root / "toypkg"), "--matrix", str(root / "matrix.yaml")]
    return commits.main(argv + ["--combo", "toy", *extra])


@pytest.fixture
def nothing_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    from fsdp_matrix.bisect.commits import CommitInstaller

    def refuse(self, candidate: str):
        raise AssertionError(f"{candidate} was installed")

    monkeypatch.setattr(CommitInstaller, "prepare", refuse)


@pytest.mark.parametrize(
    "extra, line",
    [
        (["--good", "v0.2.0", "--bad", "v0.2.0"], "--good v0.2.0 and --bad v0.2.0 are the same commit"),
        (["--good", "v0.2.0", "--bad", "v0.1.0"], "--good v0.2.0 comes after --bad v0.1.0: swap them"),
        (["--good", "v0.1.0", "--bad", "v0.2.0", "--timeout", "-1"], "give a number of seconds above 0"),
        (["--good", "v0.1.0", "--bad", "v0.2.0", "--timeout", "nan"], "give a number of seconds above 0"),
        (["--bad", "v0.2.0"], "the following arguments are required: --good"),
    ],
)
def test_bad_commit_bisect_arguments_are_one_line_before_anything_is_installed(
    toy, nothing_installed, capsys, extra, line
) -> None:
    """good == bad and reversed refs were installed and run before the answer said nothing could be compared."""
    root, _, cells = toy
    try:
        code = _commit_main(root, cells, "--cache", str(root / "args-cache"), *extra)
    except SystemExit as exc:  # argparse's refusals
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and line in err and len(err.splitlines()) == 1, err


def test_unusable_cache_json_and_twice_pinned_packages_are_one_line_up_front(toy, nothing_installed, capsys) -> None:
    """``--cache FILE`` was a FileExistsError traceback, ``--json DIR`` an IsADirectoryError after the whole
    bisect, and a second ``--pin`` of one package replaced the first without a word."""
    root, _, cells = toy
    afile = root / "afile"
    afile.write_text("x")
    ends = ["--good", "v0.1.0", "--bad", "v0.2.0"]
    toy_repo = root / "toypkg"
    for extra, line in (
        (["--cache", str(afile)], f"--cache {afile}: cannot be used as a directory"),
        (["--cache", str(root / "c2"), "--json", str(root)], f"--json {root}: is a directory"),
        (
            ["--cache", str(root / "c2"), "--pin", f"accelerate={toy_repo}@v0.1.0", "--pin", f"accelerate={toy_repo}"],
            "--pin accelerate: accelerate pinned twice",
        ),
        (
            ["--cache", str(root / "c2"), "--pin", "accelerate==1.0.0", "--pin", f"accelerate={toy_repo}"],
            "--pin accelerate: accelerate pinned twice",
        ),
    ):
        assert _commit_main(root, cells, *ends, *extra) == 2, extra
        err = capsys.readouterr().err.strip()
        assert line in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
