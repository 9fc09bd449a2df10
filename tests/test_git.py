"""fsdp_matrix.git: every git question, on the toy repository of tests/sources_support.py (no network)."""

from __future__ import annotations

import pytest

from fsdp_matrix import git
from fsdp_matrix.errors import EnvError
from tests.sources_support import make_toy_repo, write


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    repo = tmp_path_factory.mktemp("git") / "toy"
    return repo, make_toy_repo(repo)


def test_refs_merge_base_and_ancestry(toy):
    repo, shas = toy
    assert git.rev(repo, "v0.2.0") == shas["c5"] and git.rev(repo, shas["c4"][:10]) == shas["c4"]
    with pytest.raises(EnvError, match="no commit named 'nope'"):
        git.rev(repo, "nope")
    assert git.merge_base(repo, shas["v0.1.2"], shas["c5"]) == shas["c0"]
    assert git.is_ancestor(repo, shas["c0"], shas["c5"]) and not git.is_ancestor(repo, shas["c5"], shas["c0"])
    assert git.is_repository(repo) and not git.is_repository(repo.parent)


def test_the_first_parent_line_and_its_commits_with_pr_numbers(toy):
    repo, shas = toy
    base, line = git.first_parent_line(repo, "v0.1.2", "v0.2.0")
    assert base == shas["c0"] and line == [shas[f"c{i}"] for i in range(6)]
    described = {c.sha: c for c in git.describe(repo, line)}
    assert described[shas["c4"]].pr == 42 and described[shas["c4"]].subject == "Fix the toy bug (#42)"
    assert git.pr_number("Backport the fix") is None and git.describe(repo, []) == []


def test_default_branch_release_base_and_a_dirty_checkout(toy, tmp_path):
    repo, shas = toy
    assert git.default_branch(repo) == "main"
    assert git.release_base(repo, shas["c4"]) == "0.1.0"  # v0.1.3rc1 is a pre-release, v0.2.0 comes after
    assert not git.is_dirty(repo)
    write(repo, {"README": "edited\n"})
    try:
        assert git.is_dirty(repo) and "README" in git.working_files(repo)
    finally:
        git.git(repo, "checkout", "--", "README")


def test_a_commits_tree_into_a_cache_and_a_mirror(toy, tmp_path):
    repo, shas = toy
    dest = tmp_path / "snap"
    git.archive(repo, shas["c4"], dest)
    assert "return 42" in (dest / "toypkg" / "__init__.py").read_text()
    mirrored = git.mirror(repo.as_uri(), tmp_path / "cache" / "m")
    assert git.rev(mirrored, "v0.1.2") == shas["v0.1.2"]
    assert git.mirror(repo.as_uri(), mirrored) == mirrored  # fetched again, not cloned twice


def test_the_old_import_paths_still_answer():
    from fsdp_matrix.bisect import commits
    from fsdp_matrix.envs import sources
    from fsdp_matrix.gate import refs

    assert sources.git is git.git and sources.rev is git.rev and sources.release_base is git.release_base
    assert commits.describe is git.describe and commits.Commit is git.Commit and commits.first_parent_line
    assert refs.default_branch is git.default_branch and refs.first_parent_line is git.first_parent_line
