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
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from packaging.utils import canonicalize_name

from fsdp_matrix.bisect.installers import PinnedInstaller, parse_pins
from fsdp_matrix.bisect.runner import LaunchRunner
from fsdp_matrix.bisect.search import CellAnswer, Outcome, Prepared, Step, bisect_cells, install_bound
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
    repository,
    resolve,
    resolve_pins,
    rev,
)
from fsdp_matrix.errors import EnvError, MatrixError
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.progress import Heartbeat

_SEP = "\x1f"


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
        pins = {**held, **{n: f"git-{s.key.split('@', 1)[1][:20]}" for n, s in self.held.items()}}
        pins[self.pin.package] = f"git-{src.commit[:12]}"
        extra = list(self.base.combo.extra)
        sources = {**self.held, self.pin.package: src}
        return self.base.install(pins, extra, sources=sources, imports=self.imports)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
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
    p.add_argument("--combo", help="matrix.yaml combo giving the other pins (default: the newest CPU combo)")
    p.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="NAME==VERSION|NAME=SOURCE",
        help="override a combo pin with a release, or with a source held at one commit (NAME=PATH_OR_URL@REF)",
    )
    p.add_argument("--matrix", type=Path, help="matrix.yaml (default: the repo's)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the result as JSON")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--world-size", type=int, default=None, help="ranks (default: from the cell id, else 2)")
    p.add_argument("--cache", type=Path, default=None, help="step envs, snapshots and records (reused across runs)")
    p.add_argument("--timeout", type=float, default=900, help="seconds one step's launch may take")
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    start = time.monotonic()
    try:
        return _main(args, start)
    except (MatrixError, EnvError) as exc:
        print(f"fsdp-matrix bisect: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace, start: float) -> int:
    from fsdp_matrix.bisect.cli import DEFAULT_CACHE

    package = canonicalize_name(args.package)
    if package in REFUSED:
        raise EnvError(f"--package {package}: building {package} from source is refused ({REFUSED[package]})")
    cache = args.cache or DEFAULT_CACHE
    cache.mkdir(parents=True, exist_ok=True)
    pin = parse_source(package, args.git)
    repo = repository(pin, cache / "sources")
    matrix = load_matrix(args.matrix)
    combo = matrix.combo(args.combo) if args.combo else matrix.newest("cpu")
    cells = [find_cell(matrix, ref, args.device, args.world_size).key for ref in args.cells]
    sizes = {find_cell(matrix, c, args.device, args.world_size).world_size for c in cells}
    if len(sizes) > 1:
        raise EnvError(f"cells {', '.join(cells)}: one launch per step needs one world size, got {sorted(sizes)}")
    good = rev(repo, args.good)
    merge_base, line = first_parent_line(repo, args.good, args.bad)
    commits = {c.sha: c for c in describe(repo, list(dict.fromkeys([good, *line])))}
    releases = parse_pins([t for t in args.pin if "==" in t])
    held = resolve_pins([t for t in args.pin if "==" not in t], cache / "sources")
    if package in held or package in releases:
        raise EnvError(f"--pin {package}: {package} is the package being bisected (--good .. --bad)")
    installer = CommitInstaller(
        PinnedInstaller(combo, package, cache, releases, args.device), pin, cache / "sources", held=held
    )
    bound = install_bound(len(line))
    off_line = good != merge_base
    print(
        f"bisecting {', '.join(cells)} on combo {combo.id} over {len(line)} first-parent commits of {package} "
        f"({merge_base[:10]} = merge base of {args.good} and {args.bad} .. {args.bad} = {line[-1][:10]}); "
        f"at most {bound} installs plus skips" + (f", plus {args.good} itself" if off_line else ""),
        flush=True,
    )
    with Heartbeat("bisect", "starting") as beat:
        steps: List[Step] = []
        runner = LaunchRunner(
            cache,
            matrix=args.matrix,
            device=args.device,
            world_size=sizes.pop(),
            timeout=args.timeout,
            say=lambda text: None,
            status=beat.update,
            label=lambda sha: f"{package} {sha[:10]}",
        )

        def started(candidate: str, todo: Sequence[str]) -> None:
            what = f"step {len(steps) + 1}: {package} {candidate[:10]}"
            beat.update(f"{what}: installing, then running {len(todo)} cell(s)", say=True)

        def ended(step: Step) -> None:
            steps.append(step)
            seen = sorted({o.describe() for o in step.outcomes.values()})
            what = " | ".join(seen) if seen else f"skipped: {clip(_last_line(step.reason), 90)}"
            print(f"  [{len(steps)}] {step.candidate[:10]} {what} ({step.seconds:.0f}s)", flush=True)

        hooks = dict(same=same_observation, on_step=ended, on_start=started)
        known: Dict[int, Dict[str, Outcome]] = {}
        references: Dict[str, Outcome] = {}
        if off_line:
            # GOOD sits off the line (a patch release): the merge base must behave like it, or the line cannot answer
            bisect_cells(installer, runner, [good, merge_base], cells, package, **hooks)
            at = {s.candidate: s for s in steps}
            references = dict(at[good].outcomes) if good in at else {}
            at_base = dict(at[merge_base].outcomes) if merge_base in at else {}
            untested = [c for c in cells if c not in references]
            if untested:
                print(f"{args.good} ({good[:10]}) could not be tested for {', '.join(untested)}: {at[good].reason}")
                return 1
            unlike = [c for c in cells if c in at_base and not same_observation(at_base[c], references[c])]
            for cell in unlike:
                print(
                    f"{cell}: the merge base {merge_base[:10]} does not behave like {args.good}: "
                    f"{references[cell].describe()} at {args.good}, {at_base[cell].describe()} at the merge base. "
                    f"The change is on {args.good}'s branch, not on the first-parent line to {args.bad}: bisect "
                    f"that branch instead (--good {merge_base[:10]} --bad {args.good}); stopping."
                )
            if unlike:
                _write(args, cells, combo.id, {}, {}, steps, line, merge_base, start, installer)
                return 1
            known = {0: at_base}
        found = bisect_cells(installer, runner, line, cells, package, known=known, **hooks)
    firsts: Dict[str, Optional[Commit]] = {}
    for cell in cells:
        answer = found.cells[cell]
        if len(cells) > 1:
            print(f"{cell}:")
        print(table(commits, line, steps, answer, cell))
        short = answer.answer
        for sha in filter(None, [answer.first_changed, answer.last_unchanged, *answer.untestable]):
            short = short.replace(sha, sha[:10])
        print(short)
        first = firsts[cell] = commits.get(answer.first_changed or "")
        if first:
            pr = f" (PR #{first.pr})" if first.pr else ""
            print(f"first changed commit: {first.sha} {first.subject!r}, {first.date}{pr}")
            print(f"last unchanged commit: {answer.last_unchanged}")
    installs, failed = _installs(installer)
    print(
        f"{len(steps)} steps, {installs} installs"
        + (f" + {failed} that did not build or import" if failed else "")
        + f" (bound {bound} over {len(line)} commits"
        + (f", +1 for {args.good} off the line" if off_line else "")
        + f"), {(time.monotonic() - start) / 60:.1f} min",
        flush=True,
    )
    _write(args, cells, combo.id, found.cells, firsts, steps, line, merge_base, start, installer, references)
    done = all(a.first_changed or a.answer.startswith("no change") for a in found.cells.values())
    return 0 if done else 1


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


def _write(  # one JSON document, from the pieces main holds
    args: argparse.Namespace,
    cells: List[str],
    combo: str,
    answers: Mapping[str, CellAnswer],
    firsts: Mapping[str, Optional[Commit]],
    steps: List[Step],
    line: List[str],
    merge_base: str,
    start: float,
    installer: CommitInstaller,
    references: Optional[Mapping[str, Outcome]] = None,
) -> None:
    """The JSON: first_changed, last_unchanged, commit: {sha, subject, date, pr} (of the first cell, and per cell
    under ``cells``), and every step with each cell's outcome."""
    if not args.json:
        return
    per_cell = {c: _answer_json(answers.get(c), firsts.get(c), (references or {}).get(c)) for c in cells}
    data = {
        "cell": cells[0],
        "combo": combo,
        "package": canonicalize_name(args.package),
        "repo": args.git,
        "good": args.good,
        "bad": args.bad,
        "merge_base": merge_base,
        "commits": len(line),
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
            for s in steps
        ],
        "installs": _installs(installer)[0],
        "failed_installs": _installs(installer)[1],
        "install_bound": install_bound(len(line)),
        "minutes": round((time.monotonic() - start) / 60, 2),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=1, default=str))
