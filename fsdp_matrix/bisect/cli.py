"""``python -m fsdp_matrix bisect CELL --package NAME --old V --new V``: which release changed a cell's outcome.

``bisect ... --git REPO --good REF --bad REF`` bisects the package's commits instead (bisect/commits.py). Both are
load -> wire -> search -> render -> exit code, over the one search (``bisect_cells``) and the one wiring
(``bisection_from``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from fsdp_matrix import options
from fsdp_matrix.bisect import commits
from fsdp_matrix.bisect.installers import DatedInstaller, days_between, parse_pins
from fsdp_matrix.bisect.releases import release_candidates
from fsdp_matrix.bisect.runner import stopped_by_signal
from fsdp_matrix.bisect.search import CellAnswer, Installer, SearchResult, Step, bisect_cells, install_bound
from fsdp_matrix.bisect.wiring import Bisection, StepOptions, add_step_arguments, bisection_from
from fsdp_matrix.cells import Cell, find_cell, unmet_requirement
from fsdp_matrix.clip import clip
from fsdp_matrix.errors import EnvError, MatrixError
from fsdp_matrix.expectations import expected_for
from fsdp_matrix.matrix import Combo, Matrix, load_matrix
from fsdp_matrix.paths import writable_file
from fsdp_matrix.progress import Heartbeat
from fsdp_matrix.usage import OneLineParser, flat

_PROJECT = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
"""A valid project name (PEP 508)."""


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="fsdp-matrix bisect",
        description=(
            "Find the first release (or day) at which a cell's observed outcome changes: a bug appearing or a fix "
            "landing. Each step installs a fresh env from the combo's pins and runs the cell on a real launch."
        ),
    )
    p.add_argument("cell", help="CASE/CELL (or a cell id unique across cases)")
    p.add_argument("--package", help="package to bisect (required unless --by-date)")
    p.add_argument("--old", help="oldest release to consider")
    p.add_argument("--new", help="newest release to consider")
    p.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="NAME==VERSION",
        help="override a combo pin for every step (repeatable)",
    )
    options.add_arguments(p.add_argument, ("combo",), model=options.MatrixOptions)  # declared once
    p.add_argument("--json", type=Path, metavar="PATH", help="write the result as JSON")
    p.add_argument("--pre", action="store_true", help="include pre-releases")
    p.add_argument(
        "--by-date",
        nargs=2,
        metavar=("OLD_DATE", "NEW_DATE"),
        help="bisect over days (YYYY-MM-DD): torch stays pinned, every other package floats to that day",
    )
    # the step options, declared once (bisect/wiring.py); the world size defaults to the cell id's
    add_step_arguments(p, timeout=900, cache_help="where step envs live (reused across runs)")
    return p


def _version(option: str, value: str) -> Version:
    try:
        return Version(value)
    except InvalidVersion:
        raise EnvError(f"{option} {value!r}: not a version (e.g. 0.13.2)") from None


def _skipped(matrix: Matrix, cell: Cell, ends: Sequence[Mapping[str, str]]) -> Optional[str]:
    """Why the cell is skipped at both ends (the same for every candidate, as a run would record it), or None.

    Without ends (``--by-date``: the versions float) only what needs no versions is known: device and world size.
    """
    case = matrix.case(cell.case)
    reason = unmet_requirement(case.requires, cell)
    if reason or not ends:
        return reason
    reasons = []
    for pins in ends:
        expected = expected_for(case, cell, pins)
        if expected.kind != "skip":
            return None
        reasons.append(f"{expected.reason} [{expected.source}]")
    return "; ".join(dict.fromkeys(reasons))


def _reason(step: Step) -> str:
    # an installer's reason comes last in its output
    return clip(clip(step.reason, lines=1, tail=True), 90)


@dataclass
class Question:
    """A release (or day) bisect of one cell, as loaded from the command line."""

    cell: Cell
    """The cell."""
    combo: Combo
    """The combo giving the other pins."""
    what: str
    """The package bisected, or ``date``."""
    candidates: List[str]
    """Every candidate between the ends, oldest first."""
    bisection: Bisection
    """The installer over the combo's pins and the runner."""
    installer: Installer
    """What installs a candidate: the bisection's, or a DatedInstaller over it."""
    dated: Optional[DatedInstaller] = None
    """With --by-date: the installer that can say which packages moved between two days."""


@dataclass
class Answer:
    """The search's answer for the one cell, with the candidates asked for."""

    result: SearchResult
    """The search: candidates and steps."""
    cell: CellAnswer
    """The cell's answer."""

    def to_json(self) -> Dict[str, Any]:
        c = self.cell
        return {
            "package": self.result.package,
            "old": self.result.candidates[0],
            "new": self.result.candidates[-1],
            "candidates": self.result.candidates,
            "first_changed": c.first_changed,
            "last_unchanged": c.last_unchanged,
            "untestable": c.untestable,
            "steps": [asdict(s) for s in self.result.steps],
            "answer": c.answer,
            "installs": self.result.installs,
        }


def table(answer: Answer) -> str:
    rows = [("tested", "installed", "outcome", "seconds")]
    order = {c: i for i, c in enumerate(answer.result.candidates)}
    marks = {answer.cell.first_changed: " <- first changed", answer.cell.last_unchanged: " <- last unchanged"}
    for step in sorted(answer.result.steps, key=lambda s: order.get(s.candidate, -1)):
        what = step.outcome.describe() if step.outcome else f"skipped: {_reason(step)}"
        mark = marks.get(step.candidate, "")
        rows.append((step.candidate, "yes" if step.installed else "no", what + mark, f"{step.seconds:.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]:>7}" for r in rows)


def _progress(step: Step) -> None:
    what = step.outcome.describe() if step.outcome else f"skipped: {_reason(step)}"
    print(f"  {step.candidate}: {what} ({step.seconds:.0f}s)", flush=True)


def _check_args(args: argparse.Namespace) -> Dict[str, str]:
    """Everything that needs no matrix: versions, days, paths, the package name; the --pin overrides."""
    for option, value in (("--old", args.old), ("--new", args.new)):
        if value is not None and not args.by_date:
            _version(option, value)
    if args.by_date:
        days_between(*args.by_date)
    if args.json:
        writable_file(args.json)
    pins = parse_pins(args.pin)
    if args.package is not None:
        if not _PROJECT.match(args.package):
            raise EnvError(f"--package {args.package!r}: not a package name")
        name = canonicalize_name(args.package)
        if name in pins:
            raise EnvError(
                f"--pin {name}=={pins[name]}: {name} is the package being bisected (its range is --old .. --new)"
            )
    return pins


def load(args: argparse.Namespace) -> Question:
    """Read the matrix, find the cell and the combo, check every argument, and wire the installer and runner."""
    matrix = load_matrix(args.matrix)
    combo = matrix.combo(args.combo) if args.combo is not None else matrix.newest("cpu")
    cell = find_cell(matrix, args.cell, args.device, args.world_size)
    pins = _check_args(args)
    # each step's results and launch logs stay under the cache (cache/runs), for a look at a surprising step
    wired = bisection_from(
        StepOptions.from_args(args), combo, package=args.package or "peft", pins=pins,
        world_size=cell.world_size, resume=False, bare=True, say=lambda text: None,
    )  # fmt: skip
    ends = [wired.installer.pins_for(v) for v in (args.old, args.new)] if not args.by_date else []
    skipped = _skipped(matrix, cell, ends)
    if skipped:
        raise EnvError(f"{cell.key}: the cell is skipped on this combo: {skipped}")
    if args.by_date:
        dated = DatedInstaller(wired.installer)
        return Question(cell, combo, "date", days_between(*args.by_date), wired, dated, dated)
    candidates = release_candidates(args.package, args.old, args.new, args.pre)
    return Question(cell, combo, args.package, candidates, wired, wired.installer)


def search(q: Question) -> Answer:
    """The bisection, with a heartbeat and a line per step."""
    n = len(q.candidates)
    print(
        f"bisecting {q.cell.key} on combo {q.combo.id} over {n} candidates "
        f"({q.what} {q.candidates[0]} .. {q.candidates[-1]}); at most {install_bound(n)} installs plus skips",
        flush=True,
    )
    with Heartbeat("bisect", "starting") as beat:
        steps: List[Step] = []

        def started(candidate: str, cells: Sequence[str]) -> None:
            beat.update(f"step {len(steps) + 1}: {q.what} {candidate}: installing, then running the cell", say=True)

        def ended(step: Step) -> None:
            steps.append(step)
            _progress(step)

        # a candidate the cell cannot run at is one that cannot be installed, as the answers have always said
        result = bisect_cells(
            q.installer, q.bisection.runner, q.candidates, [q.cell.key], q.what,
            on_step=ended, on_start=started, tested="installed",
        )  # fmt: skip
    return Answer(result, result.cells[q.cell.key])


def render(q: Question, answer: Answer, json_path: Optional[Path]) -> int:
    """Print the table and the answer, write --json; the exit code."""
    print(table(answer))
    print(answer.cell.answer)
    data = answer.to_json()
    # "installs" counts the steps; an env already in the cache is reused, not installed (it was counted as one)
    log = getattr(q.bisection.installer, "log", [])
    installed, reused = sum(e.ok and not e.reused for e in log), sum(e.ok and e.reused for e in log)
    skipped = sum(not s.installed for s in answer.result.steps)
    steps = len(answer.result.steps)
    print(f"{steps} steps: {installed} envs installed, {reused} reused from the cache, {skipped} skipped")
    data.update(cell=q.cell.key, combo=q.combo.id, installed=installed, reused=reused)
    first, last = answer.cell.first_changed, answer.cell.last_unchanged
    if q.dated and first and last:
        changes = q.dated.changes(last, first)
        data["changed_packages"] = changes
        print(f"changed between {last} and {first}: " + (", ".join(changes) or "nothing"))
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(data, indent=1, default=str))
    return 0 if first or answer.cell.answer.startswith("no change") else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return stopped_by_signal("fsdp-matrix bisect", lambda: _main(argv))


def _main(argv: List[str]) -> int:
    if any(a == "--git" or a.startswith("--git=") for a in argv):
        return commits.main(argv)  # the commit bisect: --git REPO --good REF --bad REF
    p = parser()
    args = p.parse_args(argv)
    if not args.by_date and None in (args.package, args.old, args.new):
        p.error("give --package, --old and --new (or --by-date OLD_DATE NEW_DATE)")
    try:
        question = load(args)
        answer = search(question)
    except MatrixError as exc:
        print(f"fsdp-matrix bisect: {flat(exc)}", file=sys.stderr)
        return 2
    return render(question, answer, args.json)
