"""Head, base and the commits between: the merge base with the default branch, or with --base."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsdp_matrix.envs.sources import SourcePin
from fsdp_matrix.errors import EnvError
from fsdp_matrix.gate.refs import default_branch, resolve_refs
from fsdp_matrix.gate.request import GateRequest
from tests.gate.support import make_pr_repo
from tests.sources_support import git


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("refs") / "toypkg"
    return root, make_pr_repo(root)


def test_the_base_is_the_merge_base_with_the_default_branch(repo, tmp_path: Path) -> None:
    root, shas = repo
    refs = resolve_refs(GateRequest(SourcePin("toypkg", str(root), "pr")), tmp_path)
    assert (refs.head, refs.base, refs.base_ref) == (shas["p3"], shas["m0"], "main")
    assert refs.line == [shas["m0"], shas["p1"], shas["p2"], shas["p3"]] and refs.pr_commits == 3
    assert refs.commits[shas["p2"]].pr == 3 and not refs.dirty


def test_base_overrides_the_default_branch(repo, tmp_path: Path) -> None:
    root, shas = repo
    refs = resolve_refs(GateRequest(SourcePin("toypkg", str(root), "pr-mended"), base="pr"), tmp_path)
    assert (refs.base, refs.line) == (shas["p3"], [shas["p3"], shas["p4"]])


def test_a_clone_says_its_default_branch_through_origin_head(repo, tmp_path: Path) -> None:
    root, _ = repo
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(root), str(clone))
    assert default_branch(clone) == "origin/pr"  # the branch checked out in the origin when cloned
    with pytest.raises(EnvError, match="no commit named 'nope'"):
        resolve_refs(GateRequest(SourcePin("toypkg", str(clone), "nope")), tmp_path)


def test_a_checkout_with_uncommitted_changes_is_gated_at_its_head_and_says_so(repo, tmp_path: Path) -> None:
    root, shas = repo
    clone = tmp_path / "dirty"
    git(tmp_path, "clone", "-q", str(root), str(clone))
    (clone / "toypkg" / "__init__.py").write_text("def behave():\n    return 0\n")
    refs = resolve_refs(GateRequest(SourcePin("toypkg", str(clone)), base="origin/main"), tmp_path)
    assert refs.head == shas["p3"] and refs.dirty
