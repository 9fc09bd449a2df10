"""Which commits the gate compares: the head, the base (the merge base of the head with the default branch, or with
``--base``), and the first-parent commits of the pull request between them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from fsdp_matrix.envs.sources import repository
from fsdp_matrix.errors import EnvError
from fsdp_matrix.gate.request import GateRequest

# git is asked through fsdp_matrix.git; these names stay importable from here
from fsdp_matrix.git import (  # noqa: F401
    DEFAULT_BRANCHES,
    Commit,
    default_branch,
    describe,
    first_parent_line,
    git,
    is_dirty,
    merge_base,
    rev,
)


@dataclass(frozen=True)
class Refs:
    """The two ends of a gate and the commits between them."""

    repo: Path
    """The local git dir of the package (the checkout itself, or a mirror of a URL)."""
    head: str
    """The head's full SHA."""
    base_ref: str
    """What the base was asked as: ``--base``, or the default branch found."""
    base: str
    """The base's full SHA: the merge base of ``base_ref`` and the head."""
    line: List[str]
    """The first-parent commits from the base to the head, oldest first (the base first)."""
    commits: Dict[str, Commit]
    """SHA -> subject, date and PR of every commit of ``line``."""
    dirty: bool = False
    """The checkout has uncommitted changes, which the gate leaves out (it builds commits)."""

    @property
    def pr_commits(self) -> int:
        """Commits of the pull request: the line after the base."""
        return len(self.line) - 1


def _is_dirty(repo: Path, local: bool) -> bool:
    return local and is_dirty(repo)


def resolve_refs(req: GateRequest, sources_cache: Path) -> Refs:
    """Head, base and the line between them; EnvError (one line) for a ref the repository does not have."""
    repo = repository(req.pin, sources_cache)
    if not (Path(repo) / ".git").exists() and not (Path(repo) / "HEAD").exists():
        raise EnvError(f"--pin {req.pin.package}={req.pin.repo}: not a git repository")
    head = rev(repo, req.head)
    base_ref = req.base or default_branch(repo)
    base_tip = rev(repo, base_ref)
    if not merge_base(repo, base_tip, head):
        raise EnvError(f"--base {base_ref}: no common history with {req.head} ({head[:10]})")
    base, line = first_parent_line(repo, base_tip, head)
    commits = {c.sha: c for c in describe(repo, line)}
    return Refs(repo, head, base_ref, base, line, commits, _is_dirty(repo, req.pin.local and not req.pin.ref))


def short(refs: Refs, sha: Optional[str]) -> str:
    """``1a2b3c4d5e "subject (#12)"`` for a commit of the line, else the short SHA."""
    if not sha:
        return "-"
    commit = refs.commits.get(sha)
    return f"{sha[:10]} {commit.subject!r}" if commit else sha[:10]
