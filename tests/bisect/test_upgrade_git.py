"""``upgrade --git NAME=REPO`` over the toy package's real git repository (tests/sources_support.py): the release
bisect, then the commit bisect between the last unchanged and the first changed release's tags. Git, the merge
base, the first-parent line and each commit's snapshot are real; the install and the launch are faked by reading
the snapshot (the real launch path is the one ``bisect --git`` uses, tested in test_commits.py). No peft clone."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

from fsdp_matrix.bisect import upgrade
from fsdp_matrix.bisect.commits import first_parent_line
from fsdp_matrix.bisect.installers import InstallLog
from fsdp_matrix.bisect.search import Outcome, Prepared, install_bound
from fsdp_matrix.bisect.upgrade_git import parse_git_args, release_tag
from fsdp_matrix.envs.sources import Resolved, SourcePin, resolve
from fsdp_matrix.errors import EnvError
from fsdp_matrix.matrix import load_matrix
from tests.sources_support import BUG, commit, git, make_toy_repo

FIXTURE = Path(__file__).parent / "fixtures" / "bisect_matrix.yaml"
PLAIN, TWIN, STEADY = "toy/plain", "toy/twin", "toy/steady"
RELEASES = ["0.1.0", "0.1.1", "0.1.2", "0.2.0", "0.3.0"]


class ToyInstaller:
    """A release of "peft" is the toy repo's tag ``vX.Y.Z``; a commit is the snapshot the commit bisect hands over.
    Either way the env is that tree: a tree whose pyproject.toml is broken does not install."""

    def __init__(self, combo, repo: Path, cache: Path) -> None:
        self.combo, self.repo, self.cache = combo, repo, cache
        self.overrides: Dict[str, str] = {}
        self.log: List[InstallLog] = []
        self.trees: Dict[Path, Path] = {}

    def install(self, pins, extra, sources: Optional[Dict[str, Resolved]] = None, imports=()) -> Prepared:
        src = (sources or {}).get("peft") or resolve(SourcePin("peft", str(self.repo), f"v{pins['peft']}"), self.cache)
        tree = Path(src.snapshot)
        ok = (tree / "pyproject.toml").read_text().startswith("[build-system]")
        self.log.append(InstallLog(dict(pins), ok, False, 0.0))
        if not ok:
            return Prepared(None, "install failed\nerror: pyproject.toml: invalid TOML")
        env = Path(f"/envs/{len(self.trees)}")
        self.trees[env] = tree
        return Prepared(env)


class ToyRunner:
    """plain and twin run toypkg.behave(); steady never changes. Every call is one launch."""

    def __init__(self, installer: ToyInstaller) -> None:
        self.installer = installer
        self.launches: List[tuple] = []

    def run_cells(self, env: Path, candidate: str, cells: Sequence[str]):
        self.launches.append((candidate, tuple(cells)))
        fixed = "return 42" in (self.installer.trees[env] / "toypkg" / "__init__.py").read_text()
        bug = Outcome.observed("error", "RuntimeError", "toy bug present", "reproduced")
        ok = Outcome.observed("ok", verdict="fix-holds")
        return {c: ok if fixed or c == STEADY else bug for c in cells}


def candidates(package: str, old: str, new: str, pre: bool) -> List[str]:
    # the toy's "index" holds the two ends only: the release bisect is its base and target runs
    assert old in RELEASES and new in RELEASES
    return [old, new]


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("upgit")
    return root / "toypkg", make_toy_repo(root / "toypkg")


def upgrade_toy(repo: Path, tmp_path: Path, base: str, target: str, cells=(PLAIN, TWIN, STEADY), git_map=None):
    combo = load_matrix(FIXTURE).combo("old").with_pins(peft=base)
    installer = ToyInstaller(combo, repo, tmp_path / "src")
    runner = ToyRunner(installer)
    repos = {"peft": SourcePin("peft", str(repo))} if git_map is None else git_map
    result = upgrade.run_upgrade(
        combo, {"peft": target}, list(cells), installer, runner, candidates=candidates, git=repos, cache=tmp_path
    )
    return result, installer, runner


def test_release_then_commit_all_cells_share_every_commit_step(toy, tmp_path) -> None:
    repo, shas = toy
    result, installer, runner = upgrade_toy(repo, tmp_path, "0.1.1", "0.2.0")
    assert [c.cell for c in result.changed] == [PLAIN, TWIN]
    for c in result.changed:
        assert (c.first_changed, c.last_unchanged) == ({"peft": "0.2.0"}, {"peft": "0.1.1"})
        # c3 does not build: skipped as git bisect skip would, so it stays a possible change
        assert c.first_changed_commit == {
            "peft": {
                "sha": shas["c4"],
                "subject": "Fix the toy bug (#42)",
                "date": "2024-01-01T00:00:00+00:00",
                "pr": 42,
            }
        }
        assert c.last_unchanged_commit == {"peft": shas["c2"]}
        assert "first changed commit: peft " + shas["c4"][:10] in c.answer and "(PR #42)" in c.answer
        assert "untestable " + shas["c3"][:10] in c.answer
    [line] = result.commit_lines
    assert (line.good_tag, line.bad_tag, line.merge_base, line.commits) == ("v0.1.1", "v0.2.0", shas["c0"], 6)
    # v0.1.1 sits off the line: the merge base runs first; v0.2.0's outcome is the target run's, not a step
    commit_launches = [(cand, cells) for cand, cells in runner.launches if len(cand) == 40]
    assert commit_launches[0] == (shas["c0"], (PLAIN, TWIN))
    assert shas["c5"] not in {cand for cand, _ in commit_launches}
    # both cells in every commit launch: two cells cost what one costs
    assert all(cells == (PLAIN, TWIN) for _, cells in commit_launches)
    commit_installs = [log for log in installer.log if log.pins["peft"].startswith("git-")]
    assert line.steps == len(commit_installs) <= install_bound(6)
    assert result.install_bound == 3 + install_bound(6)  # the releases: ceil(log2 2) + 2
    one, _, _ = upgrade_toy(repo, tmp_path, "0.1.1", "0.2.0", cells=(PLAIN, STEADY))
    assert one.commit_lines[0].steps == line.steps

    text = upgrade.render(result)
    assert f"first changed commit: peft {shas['c4']} 'Fix the toy bug (#42)' (PR #42)" in text
    assert f"commit bisect peft 0.1.1 .. 0.2.0: 6 commits from the merge base {shas['c0'][:10]}" in text
    data = json.loads(json.dumps(result.to_json(), default=str))
    assert data["changed"][0]["first_changed_commit"]["peft"]["sha"] == shas["c4"]
    assert data["commit_lines"][0]["merge_base"] == shas["c0"]


def test_a_release_on_the_line_costs_no_step_at_either_end(toy, tmp_path) -> None:
    repo, shas = toy
    result, _, runner = upgrade_toy(repo, tmp_path, "0.1.0", "0.2.0", cells=(PLAIN,))
    assert result.changed[0].first_changed_commit["peft"]["sha"] == shas["c4"]
    tested = {cand for cand, _ in runner.launches if len(cand) == 40}
    assert tested and not tested & {shas["c0"], shas["c5"]}, "both ends are known from the release runs"


def test_a_merge_base_unlike_the_last_unchanged_release_is_said_and_not_bisected(tmp_path) -> None:
    repo = tmp_path / "toypkg"
    shas = make_toy_repo(repo)
    git(repo, "checkout", "-q", "main")
    commit(repo, "Bring the bug back (#7)", {"toypkg/__init__.py": BUG})
    git(repo, "tag", "v0.3.0")
    result, _, runner = upgrade_toy(repo, tmp_path, "0.1.2", "0.3.0", cells=(PLAIN,))
    [changed] = result.changed
    assert changed.first_changed == {"peft": "0.3.0"} and changed.first_changed_commit == {}
    assert f"merge base {shas['c0'][:10]} does not behave like 0.1.2" in changed.answer
    assert [cand for cand, _ in runner.launches if len(cand) == 40] == [shas["c0"]]


def test_a_release_without_a_tag_keeps_the_release_answer(toy, tmp_path) -> None:
    repo, _ = toy
    bare = tmp_path / "untagged"
    git(tmp_path, "clone", "-q", "--no-tags", str(repo), str(bare))
    combo = load_matrix(FIXTURE).combo("old").with_pins(peft="0.1.1")
    installer = ToyInstaller(combo, repo, tmp_path / "src")
    result = upgrade.run_upgrade(
        combo,
        {"peft": "0.2.0"},
        [PLAIN],
        installer,
        ToyRunner(installer),
        candidates=candidates,
        git={"peft": SourcePin("peft", str(bare))},
        cache=tmp_path,
    )
    [changed] = result.changed
    assert changed.first_changed == {"peft": "0.2.0"} and changed.first_changed_commit == {}
    assert "no commit bisect of peft" in changed.answer and "release 0.1.1: no tag names it" in changed.answer
    assert "no tag names it" in upgrade.render(result)


def test_release_tag_follows_the_repository_pattern(tmp_path, toy) -> None:
    repo, _ = toy
    assert release_tag(repo, "0.2.0") == "v0.2.0"
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", "--no-tags", str(repo), str(other))
    git(other, "tag", "toypkg-0.2.0", "HEAD")
    git(other, "tag", "toypkg-0.2.0rc1", "HEAD~1")
    assert release_tag(other, "0.2.0") == "toypkg-0.2.0"
    with pytest.raises(EnvError, match="release 0.9.0: no tag names it"):
        release_tag(other, "0.9.0")


def test_git_args_are_checked_in_one_line_before_anything_runs(toy, tmp_path, capsys) -> None:
    repo, _ = toy
    notgit = tmp_path / "plain-dir"
    notgit.mkdir()
    assert parse_git_args([f"peft={repo}"], {"peft": "0.14.0"})["peft"].repo == str(repo)
    argv = ["peft==0.14.0", "--combo", "old", "--matrix", str(FIXTURE), "--cache", str(tmp_path / "c")]
    for extra, line in (
        ([f"--git=transformers={repo}"], "transformers is not bumped (bumped: peft)"),
        (["--git", "peft"], "expected NAME=REPO"),
        (["--git", f"peft={tmp_path / 'nowhere'}"], "no such path"),
        (["--git", f"peft={notgit}"], "is not a git repository"),
        (["--git", f"peft={repo}@v0.1.0"], "a repository, not a ref"),
        (["--git", f"peft={repo}", "--git", f"PEFT={repo}"], "peft given twice"),
    ):
        assert upgrade.main(argv + extra) == 2, extra
        err = capsys.readouterr().err.strip()
        assert line in err and len(err.splitlines()) == 1, (extra, err)
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").glob("env-*"))


def test_without_git_no_commit_is_searched(toy, tmp_path) -> None:
    repo, _ = toy
    result, _, runner = upgrade_toy(repo, tmp_path, "0.1.1", "0.2.0", git_map={})
    assert result.commit_lines == [] and all(c.first_changed_commit == {} for c in result.changed)
    assert all(len(cand) != 40 for cand, _ in runner.launches)


PEFT_CLONE = Path(os.environ.get("FSDP_MATRIX_PEFT_CLONE", "/work/peft-clone"))


@pytest.mark.skipif(
    not (PEFT_CLONE / ".git").exists(),
    reason=f"no peft clone at {PEFT_CLONE} (set FSDP_MATRIX_PEFT_CLONE to a git clone of huggingface/peft)",
)
def test_peft_clone_releases_have_v_tags_and_v0_13_2_sits_off_the_line() -> None:
    assert (release_tag(PEFT_CLONE, "0.13.2"), release_tag(PEFT_CLONE, "0.14.0")) == ("v0.13.2", "v0.14.0")
    base, line = first_parent_line(PEFT_CLONE, "v0.13.2", "v0.14.0")
    assert git(PEFT_CLONE, "rev-parse", "v0.13.2^{commit}") != base == line[0]
