"""``python -m fsdp_matrix bisect CELL --package peft --git REPO --good REF --bad REF``: which commit changed a cell.

The candidates are the first-parent commits from the merge base of GOOD and BAD to BAD (patch tags such as v0.13.2
sit on release branches, off main's line). GOOD is tested first when it is off the line, then the merge base: if
the merge base does not behave like GOOD, the line cannot answer the question and the command says so and stops.
Each step installs the combo's pins with the package built from a clean snapshot of that commit (``git archive``,
fsdp_matrix.envs.sources) into a step env keyed on the commit, reused from the cache. The search is bisect/search.py's
``bisect_cells`` over the ordered commits; a commit that does not build or import is skipped as ``git bisect skip``
would. The answer is the first commit whose observed outcome differs from GOOD's, with its subject, author date and
the PR number of a squash merge's ``(#NNNN)``, and the last unchanged commit.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from packaging.utils import canonicalize_name

from fsdp_matrix import options
from fsdp_matrix.bisect.installers import PinnedInstaller, parse_pins
from fsdp_matrix.bisect.outcome import Outcome
from fsdp_matrix.bisect.runner import LaunchRunner
from fsdp_matrix.bisect.search import CellAnswer, Prepared, Step, bisect_cells, install_bound
from fsdp_matrix.bisect.wiring import StepOptions, add_step_arguments, bisection_from
from fsdp_matrix.cells import find_cell
from fsdp_matrix.clip import clip
from fsdp_matrix.envs import DEFAULT_IMPORTS
from fsdp_matrix.envs.sources import (
    REFUSED,
    Resolved,
    SourcePin,
    git,
    parse_source,
    pr_number,
    redact_url,
    repository,
    resolve,
    resolve_pins,
    rev,
)
from fsdp_matrix.errors import EnvError, MatrixError
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.paths import usable_dir, writable_file
from fsdp_matrix.progress import Heartbeat
from fsdp_matrix.usage import OneLineParser, flat

_SEP = "\x1f"
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
"""A distribution name (PEP 508)."""


@dataclass(frozen=True)
class Commit:
    """One commit of the line bisected."""

    sha: str
    """Full SHA."""
    subject: str
    """First line of the message."""
    date: str
    """Author date, ISO 8601."""
    pr: Optional[int]
    """The PR number of a squash merge (``... (#2167)``), else None."""


def describe(repo: Path, shas: Sequence[str]) -> List[Commit]:
    """Subject, author date and PR of each commit, in the order given."""
    if not shas:
        return []
    out = git(repo, "log", "--no-walk=unsorted", f"--format=%H{_SEP}%s{_SEP}%aI", *shas)
    rows = [line.split(_SEP, 2) for line in out.splitlines() if line]
    return [Commit(sha, subject, date, pr_number(subject)) for sha, subject, date in rows]


def first_parent_line(repo: Path, good: str, bad: str) -> Tuple[str, List[str]]:
    """(merge base, [merge base, ..., BAD]): BAD's first-parent commits after the merge base, oldest first."""
    good_sha, bad_sha = rev(repo, good), rev(repo, bad)
    base = git(repo, "merge-base", good_sha, bad_sha)
    line = git(repo, "rev-list", "--first-parent", "--reverse", f"{base}..{bad_sha}").split()
    return base, [base, *line]


def same_observation(a: Outcome, b: Outcome) -> bool:
    """Two steps behave alike when the cell did the same thing; the verdict is left out, because rules judge each
    commit as its own release base and a commit on main is judged against an older release's rules."""
    return (a.status, a.error_type, a.message) == (b.status, b.error_type, b.message)


def import_name(package: str) -> str:
    """The module a package is imported as (``peft`` -> ``peft``); a dash becomes an underscore."""
    return canonicalize_name(package).replace("-", "_")


class CommitInstaller:
    """An Installer whose candidates are commits of one package's repository, over a combo's other pins."""

    def __init__(
        self,
        base: PinnedInstaller,
        pin: SourcePin,
        source_cache: Path,
        context: Optional[Mapping[str, str]] = None,
        held: Optional[Mapping[str, Resolved]] = None,
    ) -> None:
        self.base, self.pin, self.source_cache = base, pin, source_cache
        self.context = dict(context) if context is not None else None
        """The other packages' pins (an upgrade holds them at its base or target); None: the combo's, with --pin."""
        self.held = dict(held or {})
        """Other packages built from source at one commit for every step (the nightly's main combo holds the
        packages it does not bisect at tonight's commits)."""
        self.imports = tuple(dict.fromkeys([*DEFAULT_IMPORTS, import_name(pin.package)]))

    def prepare(self, candidate: str) -> Prepared[Path]:
        try:
            src = resolve(SourcePin(self.pin.package, self.pin.repo, candidate), self.source_cache)
        except EnvError as exc:
            return Prepared(None, str(exc))
        # the pin's value only names the env (one per commit); the source build replaces it
        held = (
            self.context if self.context is not None else {**self.base.combo.pins.model_dump(), **self.base.overrides}
        )
        # the whole key of a held source: a working tree edited between runs names another env (and results)
        pins = {
            **held,
            **{n: f"git-{s.commit[:20]}" + (f"+{s.dirty}" if s.dirty else "") for n, s in self.held.items()},
        }
        pins[self.pin.package] = f"git-{src.commit[:12]}"
        extra = list(self.base.combo.extra)
        sources = {**self.held, self.pin.package: src}
        return self.base.install(pins, extra, sources=sources, imports=self.imports)


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="fsdp-matrix bisect --git",
        description="Find the first commit of a package whose build changes a cell's observed outcome.",
    )
    p.add_argument(
        "cells",
        nargs="+",
        metavar="CELL",
        help="CASE/CELL (or a cell id unique across cases); several cells share every step",
    )
    p.add_argument("--package", required=True, help="package built from the repository, e.g. peft")
    p.add_argument("--git", required=True, metavar="REPO", help="local clone (path) or git URL of the package")
    p.add_argument("--good", required=True, metavar="REF", help="ref whose outcome is the reference, e.g. v0.13.2")
    p.add_argument("--bad", required=True, metavar="REF", help="ref whose outcome differs, e.g. v0.14.0")
    options.add_arguments(p.add_argument, ("combo",), model=options.MatrixOptions)  # declared once
    p.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="NAME==VERSION|NAME=SOURCE",
        help="override a combo pin with a release, or with a source held at one commit (NAME=PATH_OR_URL@REF)",
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="write the result as JSON")
    # the step options, declared once (bisect/wiring.py); the world size defaults to the cell id's
    add_step_arguments(p, timeout=900)
    return p


def _last_line(reason: str) -> str:
    # an installer's reason ends with its most specific line; uv draws a tree in front of it
    lines = [line.strip(" │├╰─▶×") for line in reason.splitlines() if line.strip(" │├╰─▶×")]
    return lines[-1] if lines else reason


def table(commits: Dict[str, Commit], order: List[str], steps: List[Step], answer: CellAnswer, cell: str) -> str:
    """One row per tested commit, in line order (GOOD off the line first)."""
    rows = [("#", "commit", "subject", "outcome", "seconds")]
    index = {sha: i for i, sha in enumerate(order)}
    for step in sorted(steps, key=lambda s: index.get(s.candidate, -1)):
        seen = step.outcomes.get(cell)
        what = seen.describe() if seen else f"skipped: {clip(_last_line(step.reason), 70)}"
        mark = {answer.first_changed: " <- first changed", answer.last_unchanged: " <- last unchanged"}
        position = str(index[step.candidate]) if step.candidate in index else "good"
        subject = clip(commits[step.candidate].subject, 50) if step.candidate in commits else ""
        rows.append(
            (position, step.candidate[:10], subject, what + mark.get(step.candidate, ""), f"{step.seconds:.1f}")
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(f"{c:<{w}}" for c, w in zip(r[:4], widths)) + f"  {r[4]:>7}" for r in rows)


@dataclass(frozen=True)
class CommitRequest:
    """A commit bisect as asked for: by ``bisect --git`` on the command line, or by the nightly."""

    cells: List[str]
    """Cell refs (CASE/CELL, or an id unique across cases); several share every step."""
    package: str
    """The package built from the repository."""
    git: str
    """Its repository: a local clone or a git URL."""
    good: str
    """The ref whose outcome is the reference."""
    bad: str
    """The ref whose outcome differs."""
    combo: Optional[str] = None
    """The combo giving the other pins (default: the newest CPU combo)."""
    pins: List[str] = field(default_factory=list)
    """``NAME==VERSION`` or ``NAME=SOURCE`` overrides of the combo's pins."""
    json: Optional[Path] = None
    """Where to write the JSON answer."""
    step: StepOptions = StepOptions()
    """How each step runs."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CommitRequest:
        return cls(
            args.cells, args.package, args.git, args.good, args.bad, args.combo, list(args.pin), args.json,
            StepOptions.from_args(args),
        )  # fmt: skip


@dataclass
class Line:
    """The commits to search, and what runs them: what ``load`` finds."""

    request: CommitRequest
    package: str
    """The canonical package name."""
    combo: str
    """The combo's id."""
    cells: List[str]
    """Cell keys."""
    good: str
    """GOOD's full SHA."""
    merge_base: str
    """The merge base of GOOD and BAD: the line's first commit."""
    line: List[str]
    """The first-parent commits from the merge base to BAD, oldest first."""
    commits: Dict[str, Commit]
    """SHA -> subject, date and PR, for GOOD and the line."""
    installer: CommitInstaller
    """Installs a commit's build over the combo's pins."""
    runner: LaunchRunner
    """Runs a step's cells on one launch."""

    @property
    def off_line(self) -> bool:
        return self.good != self.merge_base


@dataclass
class Found:
    """What the search found."""

    steps: List[Step] = field(default_factory=list)
    """Every step, in the order run."""
    answers: Dict[str, CellAnswer] = field(default_factory=dict)
    """Per cell; empty when the merge base does not behave like GOOD."""
    references: Dict[str, Outcome] = field(default_factory=dict)
    """Per cell, GOOD's outcome when GOOD sits off the line."""
    stopped: Optional[int] = None
    """The exit code when the search stopped before bisecting the line."""
    untested: bool = False
    """It stopped because GOOD could not be tested: there is no answer to write."""


def load(req: CommitRequest) -> Line:
    """The repository, the line of commits, the cells and the wiring; EnvError (one line) for a bad argument."""
    package = canonicalize_name(req.package)
    if package in REFUSED:
        raise EnvError(f"--package {package}: building {package} from source is refused ({REFUSED[package]})")
    if not _NAME.match(req.package):
        raise EnvError(f"--package {req.package!r}: not a package name")
    cache = usable_dir(req.step.cache)
    if req.json:
        writable_file(req.json)
    releases, held = _held_pins(req.pins, cache)
    if package in held or package in releases:
        raise EnvError(f"--pin {package}: {package} is the package being bisected (--good .. --bad)")
    pin = parse_source(package, req.git)
    repo = repository(pin, cache / "sources")
    if not git(repo, "rev-parse", "--git-dir", check=False):
        raise EnvError(f"--git {redact_url(req.git)}: not a git repository")
    good, bad = rev(repo, req.good), rev(repo, req.bad)
    if good == bad:
        raise EnvError(f"--good {req.good} and --bad {req.bad} are the same commit ({good[:10]}): nothing to bisect")
    if _is_ancestor(repo, bad, good):
        raise EnvError(f"--good {req.good} comes after --bad {req.bad}: swap them")
    matrix = load_matrix(req.step.matrix)
    combo = matrix.combo(req.combo) if req.combo else matrix.newest("cpu")
    found = [find_cell(matrix, ref, req.step.device, req.step.world_size) for ref in req.cells]
    cells = [c.key for c in found]
    sizes = {c.world_size for c in found}
    if len(sizes) > 1:
        raise EnvError(f"cells {', '.join(cells)}: one launch per step needs one world size, got {sorted(sizes)}")
    merge_base, line = first_parent_line(repo, req.good, req.bad)
    commits = {c.sha: c for c in describe(repo, list(dict.fromkeys([good, *line])))}
    wired = bisection_from(
        req.step, combo, package=package, pins=releases, world_size=sizes.pop(), say=lambda text: None,
        label=lambda sha: f"{package} {sha[:10]}",
    )  # fmt: skip
    installer = CommitInstaller(wired.installer, pin, cache / "sources", held=held)
    return Line(req, package, combo.id, cells, good, merge_base, line, commits, installer, wired.runner)


def _is_ancestor(repo: Path, older: str, newer: str) -> bool:
    proc = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", older, newer], capture_output=True)
    return proc.returncode == 0


def _held_pins(pins: Sequence[str], cache: Path) -> Tuple[Dict[str, str], Dict[str, Resolved]]:
    """``--pin``'s releases and sources held at one commit; a package pinned twice (two sources, or a release and a
    source) is refused, as the last would otherwise win without a word."""
    releases = parse_pins([t for t in pins if "==" in t])
    held = resolve_pins([t for t in pins if "==" not in t], cache / "sources")
    for name in sorted(set(releases) & set(held)):
        raise EnvError(f"--pin {name}: {name} pinned twice (a release and a source); give one")
    return releases, held


def _hooks(q: Line, beat: Heartbeat, steps: List[Step]) -> Dict[str, Any]:
    def started(candidate: str, todo: Sequence[str]) -> None:
        what = f"step {len(steps) + 1}: {q.package} {candidate[:10]}"
        beat.update(f"{what}: installing, then running {len(todo)} cell(s)", say=True)

    def ended(step: Step) -> None:
        steps.append(step)
        seen = sorted({o.describe() for o in step.outcomes.values()})
        what = " | ".join(seen) if seen else f"skipped: {clip(_last_line(step.reason), 90)}"
        print(f"  [{len(steps)}] {step.candidate[:10]} {what} ({step.seconds:.0f}s)", flush=True)

    return dict(same=same_observation, on_step=ended, on_start=started)


def _check_good(q: Line, hooks: Dict[str, Any], found: Found) -> Optional[Dict[int, Dict[str, Outcome]]]:
    """GOOD sits off the line (a patch release): the merge base must behave like it, or the line cannot answer.
    The merge base's outcomes, known at the line's index 0; None (and ``found.stopped``) when it cannot answer."""
    good, base, cells = q.good, q.merge_base, q.cells
    bisect_cells(q.installer, q.runner, [good, base], cells, q.package, **hooks)
    at = {s.candidate: s for s in found.steps}
    found.references = dict(at[good].outcomes) if good in at else {}
    at_base = dict(at[base].outcomes) if base in at else {}
    untested = [c for c in cells if c not in found.references]
    if untested:
        print(f"{q.request.good} ({good[:10]}) could not be tested for {', '.join(untested)}: {at[good].reason}")
        found.stopped, found.untested = 1, True
        return None
    unlike = [c for c in cells if c in at_base and not same_observation(at_base[c], found.references[c])]
    for cell in unlike:
        g = q.request.good
        print(
            f"{cell}: the merge base {base[:10]} does not behave like {g}: "
            f"{found.references[cell].describe()} at {g}, {at_base[cell].describe()} at the merge base. "
            f"The change is on {g}'s branch, not on the first-parent line to {q.request.bad}: bisect "
            f"that branch instead (--good {base[:10]} --bad {g}); stopping."
        )
    if unlike:
        found.stopped = 1
        return None
    return {0: at_base}


def search(q: Line) -> Found:
    """GOOD first when it is off the line, then the line itself; every cell in each step's launch."""
    bound = install_bound(len(q.line))
    req = q.request
    print(
        f"bisecting {', '.join(q.cells)} on combo {q.combo} over {len(q.line)} first-parent commits of {q.package} "
        f"({q.merge_base[:10]} = merge base of {req.good} and {req.bad} .. {req.bad} = {q.line[-1][:10]}); "
        f"at most {bound} installs plus skips" + (f", plus {req.good} itself" if q.off_line else ""),
        flush=True,
    )
    found = Found()
    with Heartbeat("bisect", "starting") as beat:
        q.runner.status = beat.update
        hooks = _hooks(q, beat, found.steps)
        known: Optional[Dict[int, Dict[str, Outcome]]] = {}
        if q.off_line:
            known = _check_good(q, hooks, found)
            if known is None:
                return found
        found.answers = bisect_cells(q.installer, q.runner, q.line, q.cells, q.package, known=known, **hooks).cells
    return found


def render(q: Line, found: Found, start: float) -> Dict[str, Optional[Commit]]:
    """Per cell: the table, the answer with short SHAs, and the first changed commit; then the cost line."""
    firsts: Dict[str, Optional[Commit]] = {}
    for cell in q.cells:
        answer = found.answers[cell]
        if len(q.cells) > 1:
            print(f"{cell}:")
        print(table(q.commits, q.line, found.steps, answer, cell))
        short = answer.answer
        for sha in filter(None, [answer.first_changed, answer.last_unchanged, *answer.untestable]):
            short = short.replace(sha, sha[:10])  # the answer names whole SHAs; a person reads the first ten
        print(short)
        first = firsts[cell] = q.commits.get(answer.first_changed or "")
        if first:
            pr = f" (PR #{first.pr})" if first.pr else ""
            print(f"first changed commit: {first.sha} {first.subject!r}, {first.date}{pr}")
            print(f"last unchanged commit: {answer.last_unchanged}")
    installs, failed = _installs(q.installer)
    print(
        f"{len(found.steps)} steps, {installs} installs"
        + (f" + {failed} that did not build or import" if failed else "")
        + f" (bound {install_bound(len(q.line))} over {len(q.line)} commits"
        + (f", +1 for {q.request.good} off the line" if q.off_line else "")
        + f"), {(time.monotonic() - start) / 60:.1f} min",
        flush=True,
    )
    return firsts


def run(req: CommitRequest) -> Tuple[int, Optional[Dict[str, Any]]]:
    """The whole commit bisect: load -> search -> render; (exit code, the JSON answer, None when GOOD could not be
    tested). Raises MatrixError or EnvError (one line) for what it cannot do."""
    start = time.monotonic()
    q = load(req)
    found = search(q)
    if found.untested:
        return 1, None
    if found.stopped is not None:  # the merge base does not behave like GOOD: no answer per cell
        return found.stopped, to_json(q, Found(found.steps), {}, start)
    firsts = render(q, found, start)
    done = all(a.first_changed or a.answer.startswith("no change") for a in found.answers.values())
    return (0 if done else 1), to_json(q, found, firsts, start)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        code, data = run(CommitRequest.from_args(args))
    except (MatrixError, EnvError) as exc:
        print(f"fsdp-matrix bisect: {flat(exc)}", file=sys.stderr)
        return 2
    if args.json and data is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1, default=str))
    return code


def _installs(installer: CommitInstaller) -> Tuple[int, int]:
    """(envs installed, install attempts that failed): a reused env is no install; a commit that does not build is
    tried again on every run, as git bisect skip would."""
    log = installer.base.log
    return sum(1 for e in log if e.ok and not e.reused), sum(1 for e in log if not e.ok)


def _answer_json(answer: Optional[CellAnswer], first: Optional[Commit], reference: Optional[Outcome]) -> Dict:
    reference = reference or (answer.reference if answer else None)
    return {
        "first_changed": answer.first_changed if answer else None,
        "last_unchanged": answer.last_unchanged if answer else None,
        "untestable": answer.untestable if answer else [],
        "commit": asdict(first) if first else None,
        "answer": answer.answer if answer else "the merge base does not behave like GOOD",
        "reference": asdict(reference) if reference else None,
    }


def to_json(q: Line, found: Found, firsts: Mapping[str, Optional[Commit]], start: float) -> Dict[str, Any]:
    """The JSON: first_changed, last_unchanged, commit: {sha, subject, date, pr} (of the first cell, and per cell
    under ``cells``), and every step with each cell's outcome."""
    cells, req = q.cells, q.request
    per_cell = {c: _answer_json(found.answers.get(c), firsts.get(c), found.references.get(c)) for c in cells}
    installs, failed = _installs(q.installer)
    return {
        "cell": cells[0],
        "combo": q.combo,
        "package": q.package,
        "repo": redact_url(req.git),
        "good": req.good,
        "bad": req.bad,
        "merge_base": q.merge_base,
        "commits": len(q.line),
        **per_cell[cells[0]],
        "cells": per_cell,
        "steps": [
            {
                "commit": s.candidate,
                "installed": s.installed,
                "outcome": asdict(s.outcomes[cells[0]]) if cells[0] in s.outcomes else None,
                "outcomes": {c: asdict(o) for c, o in s.outcomes.items()},
                "reason": s.reason,
                "seconds": round(s.seconds, 1),
            }
            for s in found.steps
        ],
        "installs": installs,
        "failed_installs": failed,
        "install_bound": install_bound(len(q.line)),
        "minutes": round((time.monotonic() - start) / 60, 2),
    }
