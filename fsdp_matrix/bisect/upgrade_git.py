"""``upgrade --git NAME=REPO``: after the release bisect, the commit of NAME that changed each cell.

For the cells whose first changed release of NAME was found, NAME's commits are bisected from the merge base of the
last unchanged release's tag and the first changed release's tag (``vX.Y.Z``, or whatever prefix the repository's
tags carry) to the latter, as ``bisect --git`` does (bisect/commits.py): first-parent commits, a clean snapshot per
commit installed over the pins the release bisect held, a commit that does not build skipped. Cells that share a
release step share the commit steps too: one search per (last unchanged, first changed) pair, every such cell in
each launch.

What the release bisect already observed costs nothing again: the first changed release is the line's last commit,
and the last unchanged release is its first when the tag sits on the line. A patch tag (v0.13.2) sits on a release
branch: the merge base is run first, and a cell for which it does not behave like that release is said and left
out. Commits are compared on what the cell did (status, error type, message), not on the verdict: every commit is
judged by the rules of its own release base.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from fsdp_matrix.bisect.commit_request import CommitInstaller
from fsdp_matrix.bisect.commit_search import same_observation
from fsdp_matrix.bisect.installers import PinnedInstaller
from fsdp_matrix.bisect.outcome import Outcome
from fsdp_matrix.bisect.search import CellAnswer, CellsRunner, Step, bisect_cells, install_bound
from fsdp_matrix.envs.sources import SourcePin, parse_source, repository
from fsdp_matrix.errors import EnvError
from fsdp_matrix.git import Commit, describe, first_parent_line, git, is_repository


def parse_git_args(texts: Sequence[str], bumps: Mapping[str, str]) -> Dict[str, SourcePin]:
    """``--git NAME=REPO`` (repeatable) -> name -> SourcePin; NAME must be a bumped package (one line otherwise)."""
    out: Dict[str, SourcePin] = {}
    for text in texts:
        name, eq, repo = text.partition("=")
        if not eq or not name.strip() or not repo.strip():
            raise EnvError(f"--git {text!r}: expected NAME=REPO (a local clone or a git URL), e.g. peft=../peft")
        package = canonicalize_name(name.strip())
        if package not in bumps:
            raise EnvError(f"--git {text}: {package} is not bumped (bumped: {', '.join(bumps) or 'none'})")
        if package in out:
            raise EnvError(f"--git {text}: {package} given twice")
        pin = parse_source(package, repo.strip())
        if pin.ref:
            raise EnvError(f"--git {text}: a repository, not a ref (the refs are the releases' tags)")
        if pin.local and not is_repository(pin.repo):
            raise EnvError(f"--git {text}: {pin.repo} is not a git repository")
        out[package] = pin
    return out


def release_tag(repo: Path, version: str) -> str:
    """The tag of a release: ``v0.14.0`` or ``0.14.0``, else the one tag whose trailing version equals it
    (``peft-v0.14.0``)."""
    names = git(repo, "tag", "--list").split()
    for name in (f"v{version}", version):
        if name in names:
            return name
    want = Version(version)
    found = []
    for name in names:
        head = name.rstrip("0123456789.")  # a tag ends with its version; what comes before is the pattern
        tail = name[len(head) :].strip(".")
        try:
            if tail and Version(tail) == want:
                found.append(name)
        except InvalidVersion:
            continue
    if len(found) == 1:
        return found[0]
    why = f"tags {', '.join(found)} all name it" if found else "no tag names it (vX.Y.Z, X.Y.Z or PREFIX-X.Y.Z)"
    raise EnvError(f"{repo}: release {version}: {why}")


@dataclass
class CommitLine:
    """One commit search of an upgrade: the line between two releases, and what it cost."""

    package: str
    """The package whose commits were bisected."""
    last_release: str
    """Last unchanged release (GOOD)."""
    first_release: str
    """First changed release (BAD)."""
    good_tag: str = ""
    bad_tag: str = ""
    merge_base: str = ""
    """Full SHA of the merge base of the two tags: the line's first commit."""
    commits: int = 0
    """First-parent commits from the merge base to BAD's tag, both included."""
    cells: List[str] = field(default_factory=list)
    """The cells searched on this line, sharing every step."""
    steps: int = 0
    """Commits tested (installed or skipped); what the release steps already observed is not a step."""
    install_bound: int = 0
    """ceil(log2 commits) + 2."""
    error: str = ""
    """Why the line could not be searched (no tag, not a git repository); empty when it was."""


@dataclass
class CommitAnswer:
    """What the commit search said for one cell."""

    first_changed_commit: Optional[Dict[str, Any]] = None
    """``{sha, subject, date, pr}`` of the first commit whose outcome differs from the last unchanged release's."""
    last_unchanged_commit: Optional[str] = None
    """Full SHA of the commit just before it, tested (or known) and like the last unchanged release."""
    answer: str = ""
    """One line for people."""


def commit_search(
    installer: PinnedInstaller,
    runner: CellsRunner[Path],
    pin: SourcePin,
    context: Mapping[str, str],
    last: str,
    first: str,
    at_last: Mapping[str, Outcome],
    at_first: Mapping[str, Outcome],
    cells: Sequence[str],
    cache: Path,
    say: Callable[[str], None] = print,
) -> tuple[CommitLine, Dict[str, CommitAnswer]]:
    """Bisect ``pin``'s commits between releases ``last`` and ``first`` for ``cells`` (the others held at
    ``context``); ``at_last`` / ``at_first`` are the outcomes the release bisect observed at those releases."""
    line = CommitLine(pin.package, last, first, cells=list(cells))
    answers = {c: CommitAnswer() for c in cells}
    try:
        repo = repository(pin, cache / "sources")
        line.good_tag, line.bad_tag = release_tag(repo, last), release_tag(repo, first)
        line.merge_base, shas = first_parent_line(repo, line.good_tag, line.bad_tag)
    except EnvError as exc:
        line.error = str(exc)
        for cell in cells:
            answers[cell].answer = f"no commit bisect of {pin.package}: {exc}"
        return line, answers
    line.commits, line.install_bound = len(shas), install_bound(len(shas))
    name = pin.package
    say(
        f"bisecting {name} commits {line.good_tag} .. {line.bad_tag}: {len(shas)} first-parent commits from the merge "
        f"base {line.merge_base[:10]}, {len(cells)} cells; at most {line.install_bound} installs plus skips"
    )
    search = _LineSearch(CommitInstaller(installer, pin, cache / "sources", context=context), runner, name, say)
    for cell in cells:
        if cell not in at_last or cell not in at_first:
            where = last if cell not in at_last else first
            answers[cell].answer = f"no commit bisect of {name}: the release bisect has no outcome at {where}"
    cells = [c for c in cells if c in at_last and c in at_first]
    base_seen: Dict[str, Outcome] = dict(at_last)
    if git(repo, "rev-parse", f"{line.good_tag}^{{commit}}") != line.merge_base:
        base_seen, cells = _check_merge_base(search, line, at_last, cells, answers)
    if cells:
        known = {0: {c: base_seen[c] for c in cells}, len(shas) - 1: {c: at_first[c] for c in cells}}
        found = search.run(shas, cells, known)
        commits = {c.sha: c for c in describe(repo, shas)}
        for cell in cells:
            _commit_answer(answers[cell], found.cells[cell], commits, name)
    line.steps = len(search.steps)
    return line, answers


class _LineSearch:
    """The commit steps of one line: the installer and runner, and a line said per step."""

    def __init__(self, installer: CommitInstaller, runner: CellsRunner[Path], name: str, say: Callable[[str], None]):
        self.installer, self.runner, self.name, self.say = installer, runner, name, say
        self.steps: List[Step] = []

    def ended(self, step: Step) -> None:
        self.steps.append(step)
        seen = sorted({o.describe() for o in step.outcomes.values()})
        what = " | ".join(seen) if seen else f"skipped: {step.reason.strip().splitlines()[-1][:120]}"
        self.say(f"step {self.name} {step.candidate[:10]}: {what} ({step.seconds:.0f}s)")

    def run(
        self, shas: Sequence[str], cells: Sequence[str], known: Optional[Mapping[int, Mapping[str, Outcome]]] = None
    ):
        return bisect_cells(
            self.installer, self.runner, shas, cells, self.name, known=known, same=same_observation, on_step=self.ended
        )


def _check_merge_base(
    search: _LineSearch,
    line: CommitLine,
    at_last: Mapping[str, Outcome],
    cells: List[str],
    answers: Mapping[str, CommitAnswer],
) -> Tuple[Dict[str, Outcome], List[str]]:
    """The last unchanged release is a patch off the line: its merge base must behave like it. The merge base's
    outcomes, and the cells for which it does."""
    found = search.run([line.merge_base], cells)
    base_seen = {c: found.cells[c].reference for c in cells if found.cells[c].reference}
    kept: List[str] = []
    for cell in cells:
        here = base_seen.get(cell)
        if here is not None and same_observation(here, at_last[cell]):
            kept.append(cell)
            continue
        what = here.describe() if here else "could not be tested"
        last = line.last_release
        answers[cell].answer = (
            f"{search.name} merge base {line.merge_base[:10]} does not behave like {last} ({at_last[cell].describe()}"
            f" at {last}, {what} at the merge base): the change is on {line.good_tag}'s branch, not on the "
            f"line to {line.bad_tag}"
        )
    return {c: o for c, o in base_seen.items() if o is not None}, kept


def _commit_answer(answer: CommitAnswer, got: CellAnswer, commits: Mapping[str, Commit], name: str) -> None:
    """The search's answer for a cell, with short SHAs, or the first changed commit named by its subject and PR."""
    answer.answer = got.answer
    for sha in filter(None, [got.first_changed, got.last_unchanged, *got.untestable]):
        answer.answer = answer.answer.replace(sha, sha[:10])  # whole SHAs in the search's answer; people read ten
    first_commit = commits.get(got.first_changed or "")
    if not first_commit:
        return
    answer.first_changed_commit = asdict(first_commit)
    answer.last_unchanged_commit = got.last_unchanged
    pr = f" (PR #{first_commit.pr})" if first_commit.pr else ""
    answer.answer = f"first changed commit: {name} {first_commit.sha[:10]} {first_commit.subject!r}{pr}"
    answer.answer += f", {first_commit.date} (last unchanged: {(got.last_unchanged or '')[:10]})"
    if got.untestable:
        answer.answer += f", or one of the untestable {', '.join(s[:10] for s in got.untestable)}"


def seen_at(
    cands: Sequence[str], low: Mapping[str, Any], high: Mapping[str, Any], steps: Sequence[Step]
) -> Dict[str, Dict[str, Outcome]]:
    """release -> cell -> what the release bisect observed there (its ends known from the base and target runs)."""
    seen: Dict[str, Dict[str, Outcome]] = {
        cands[0]: {c: o for c, o in low.items() if isinstance(o, Outcome)},
        cands[-1]: {c: o for c, o in high.items() if isinstance(o, Outcome)},
    }
    for step in steps:
        seen.setdefault(step.candidate, {}).update(step.outcomes)
    return seen


def commit_lines(
    pkg: str,
    pin: SourcePin,
    held: Mapping[str, str],
    group: Sequence[str],
    by_cell: Mapping[str, Any],
    seen: Mapping[str, Mapping[str, Outcome]],
    installer: PinnedInstaller,
    runner: CellsRunner[Path],
    cache: Path,
    say: Callable[[str], None],
) -> List[CommitLine]:
    """One commit search per (last unchanged, first changed) release pair of ``pkg``: the cells that shared release
    steps share commit steps. ``by_cell``: the upgrade's Changed entries, given the commit answers."""
    pairs: Dict[Tuple[str, str], List[str]] = {}
    for cell in group:
        entry = by_cell[cell]
        last, first = entry.last_unchanged.get(pkg), entry.first_changed.get(pkg)
        if last and first:
            pairs.setdefault((last, first), []).append(cell)
    lines: List[CommitLine] = []
    for (last, first), cells in pairs.items():
        if Version(first) < Version(last):
            for cell in cells:
                by_cell[cell].answer += f"; no commit bisect of {pkg}: a downgrade ({last} -> {first})"
            continue
        line, answers = commit_search(
            installer, runner, pin, held, last, first, seen.get(last, {}), seen.get(first, {}), cells, cache, say
        )
        lines.append(line)
        for cell, got in answers.items():
            entry = by_cell[cell]
            if got.first_changed_commit:
                entry.first_changed_commit[pkg] = got.first_changed_commit
                entry.last_unchanged_commit[pkg] = got.last_unchanged_commit or ""
            entry.answer = "; ".join(filter(None, [entry.answer, got.answer]))
    return lines
