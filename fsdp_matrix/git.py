"""Every git question the harness asks, in one place: refs, merge bases, the commits between two refs, PR numbers,
release tags, a repository's files, a mirror of a URL and a commit's tree checked out into a cache.

envs/sources.py (source pins), bisect/ (``bisect --git``, ``upgrade --git``, the nightly) and gate/ ask git only
through this module. Each answer is one ``git -C REPO ...`` command; a failure is an EnvError with git's last line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from packaging.version import InvalidVersion, Version

from fsdp_matrix.errors import EnvError

DEFAULT_BRANCHES = ("main", "master")
"""Tried in this order when the repository does not say which branch ``origin/HEAD`` follows."""
_PR = re.compile(r"\(#(\d+)\)\s*$")
_SEP = "\x1f"


@dataclass(frozen=True)
class Commit:
    """One commit of a line of history."""

    sha: str
    """Full SHA."""
    subject: str
    """First line of the message."""
    date: str
    """Author date, ISO 8601."""
    pr: Optional[int]
    """The PR number of a squash merge (``... (#2167)``), else None."""


def git(
    repo: Path | str, *args: str, check: bool = True, text: bool = True, env: Optional[Mapping[str, str]] = None
) -> str:
    """stdout of ``git -C repo ARGS`` (``env``: added to the environment); EnvError with git's last line when it
    fails."""
    full = {**os.environ, **env} if env else None
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=text, timeout=600, env=full)
    if check and proc.returncode != 0:
        err = (proc.stderr or "").strip().splitlines() if text else []
        raise EnvError(f"git {' '.join(args[:3])} in {repo}: {err[-1] if err else f'exit {proc.returncode}'}")
    return proc.stdout.strip() if text else proc.stdout


def is_repository(repo: Path | str) -> bool:
    """``repo`` is a git directory or a checkout's top (a ``.git`` or a bare mirror's ``HEAD``)."""
    return bool(git(repo, "rev-parse", "--git-dir", check=False))


def rev(repo: Path, ref: str) -> str:
    """The full SHA ``ref`` names in ``repo`` (a branch, tag, remote branch or commit)."""
    for candidate in (ref, f"origin/{ref}"):
        sha = git(repo, "rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}", check=False)
        if sha:
            return sha
    raise EnvError(f"{repo}: no commit named {ref!r}")


def merge_base(repo: Path, a: str, b: str) -> Optional[str]:
    """The merge base of two commits, or None when they share no history."""
    return git(repo, "merge-base", a, b, check=False) or None


def is_ancestor(repo: Path, older: str, newer: str) -> bool:
    """``older`` is an ancestor of ``newer`` (or the same commit)."""
    proc = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", older, newer], capture_output=True)
    return proc.returncode == 0


def first_parent_line(repo: Path, good: str, bad: str) -> Tuple[str, List[str]]:
    """(merge base, [merge base, ..., BAD]): BAD's first-parent commits after the merge base, oldest first."""
    good_sha, bad_sha = rev(repo, good), rev(repo, bad)
    base = git(repo, "merge-base", good_sha, bad_sha)
    line = git(repo, "rev-list", "--first-parent", "--reverse", f"{base}..{bad_sha}").split()
    return base, [base, *line]


def pr_number(subject: str) -> Optional[int]:
    """The PR number a squash-merge subject ends with: ``Fix X (#2167)`` -> 2167."""
    match = _PR.search(subject)
    return int(match.group(1)) if match else None


def describe(repo: Path, shas: Sequence[str]) -> List[Commit]:
    """Subject, author date and PR of each commit, in the order given."""
    if not shas:
        return []
    out = git(repo, "log", "--no-walk=unsorted", f"--format=%H{_SEP}%s{_SEP}%aI", *shas)
    rows = [line.split(_SEP, 2) for line in out.splitlines() if line]
    return [Commit(sha, subject, date, pr_number(subject)) for sha, subject, date in rows]


def default_branch(repo: Path) -> str:
    """The branch ``origin/HEAD`` follows, else the first of ``main``/``master`` that exists; EnvError otherwise."""
    text = git(repo, "symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD", check=False)
    if text:
        return text
    for name in DEFAULT_BRANCHES:
        for ref in (name, f"origin/{name}"):
            if git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False):
                return ref
    raise EnvError(f"{repo}: no default branch found (no origin/HEAD, main or master): give --base REF")


def is_dirty(repo: Path) -> bool:
    """The checkout has uncommitted changes to tracked files."""
    return bool(git(repo, "status", "--porcelain", "--untracked-files=no", check=False))


def release_base(repo: Path, commit: str, pattern: str = "v[0-9]*") -> Optional[str]:
    """The newest release tag (no pre- or dev release) that is an ancestor of ``commit``, as a version string."""
    best: Optional[Version] = None
    for tag in git(repo, "tag", "--merged", commit, "--list", pattern).split():
        try:
            version = Version(tag.lstrip("v"))
        except InvalidVersion:
            continue
        if not (version.is_prerelease or version.is_devrelease) and (best is None or version > best):
            best = version
    return str(best) if best else None


def working_files(repo: Path) -> List[str]:
    """Tracked files plus untracked files that are not ignored, as git lists them (deleted tracked files left out)."""
    out = git(repo, "ls-files", "-z", "-co", "--exclude-standard", text=False)
    names = sorted({n.decode() for n in out.split(b"\0") if n})
    return [n for n in names if os.path.lexists(repo / n)]


def mirror(url: str, where: Path, env: Optional[Mapping[str, str]] = None) -> Path:
    """A bare mirror of ``url`` at ``where``: cloned once, fetched again (tags too, pruned) on every later call."""
    if (where / "HEAD").exists():
        git(where, "fetch", "--quiet", "--prune", "--tags", "origin", env=env)
    else:
        where.parent.mkdir(parents=True, exist_ok=True)
        git(where.parent, "clone", "--quiet", "--mirror", url, str(where), env=env)
    return where


def archive(repo: Path, commit: str, dest: Path) -> None:
    """``commit``'s tree (``git archive``, never a working state) extracted to ``dest``, which appears whole or not
    at all."""
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        with tempfile.TemporaryFile() as fh:
            proc = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit], stdout=fh, timeout=600)
            if proc.returncode != 0:
                raise EnvError(f"git archive {commit} in {repo} failed (exit {proc.returncode})")
            fh.seek(0)
            with tarfile.open(fileobj=fh) as tar:
                if hasattr(tarfile, "tar_filter"):  # Python >= 3.10.12 / 3.11.4: no absolute paths or links out
                    tar.extractall(tmp, filter="tar")
                else:
                    tar.extractall(tmp)  # git archive of a commit: paths stay inside the tree
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
