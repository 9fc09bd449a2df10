"""``python -m fsdp_matrix bisect CELL --package NAME --old V --new V``: which release changed a cell's outcome."""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from fsdp_matrix.bisect.installers import DatedInstaller, PinnedInstaller, days_between, parse_pins
from fsdp_matrix.bisect.paths import usable_dir, writable_file
from fsdp_matrix.bisect.releases import release_candidates
from fsdp_matrix.bisect.runner import LaunchRunner, OneCell
from fsdp_matrix.bisect.search import BisectResult, Step, bisect, install_bound
from fsdp_matrix.cells import Cell, find_cell, unmet_requirement
from fsdp_matrix.clip import clip
from fsdp_matrix.errors import EnvError, MatrixError
from fsdp_matrix.expectations import expected_for
from fsdp_matrix.matrix import Matrix, load_matrix
from fsdp_matrix.progress import Heartbeat
from fsdp_matrix.runner import options
from fsdp_matrix.runner.options import CONCRETE_DEVICE
from fsdp_matrix.usage import OneLineParser, flat, positive_seconds

_PROJECT = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
"""A valid project name (PEP 508)."""
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "fsdp-matrix-bisect"


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
    p.add_argument("--combo", help="matrix.yaml combo giving the other pins (default: the newest CPU combo)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the result as JSON")
    p.add_argument("--pre", action="store_true", help="include pre-releases")
    p.add_argument(
        "--by-date",
        nargs=2,
        metavar=("OLD_DATE", "NEW_DATE"),
        help="bisect over days (YYYY-MM-DD): torch stays pinned, every other package floats to that day",
    )
    # launch options, declared once (runner/options.py); the world size defaults to the cell id's
    options.add_arguments(p.add_argument, ("matrix", "device", "world_size"), choices=CONCRETE_DEVICE)
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where step envs live (reused across runs)")
    p.add_argument("--timeout", type=positive_seconds, default=900, help="seconds one step's run may take")
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


def table(result: BisectResult) -> str:
    rows = [("tested", "installed", "outcome", "seconds")]
    order = {c: i for i, c in enumerate(result.candidates)}
    for step in sorted(result.steps, key=lambda s: order.get(s.candidate, -1)):
        what = step.outcome.describe() if step.outcome else f"skipped: {_reason(step)}"
        mark = (
            " <- first changed"
            if step.candidate == result.first_changed
            else (" <- last unchanged" if step.candidate == result.last_unchanged else "")
        )
        rows.append((step.candidate, "yes" if step.installed else "no", what + mark, f"{step.seconds:.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]:>7}" for r in rows)


def _progress(step: Step) -> None:
    what = step.outcome.describe() if step.outcome else f"skipped: {_reason(step)}"
    print(f"  {step.candidate}: {what} ({step.seconds:.0f}s)", flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--git" or a.startswith("--git=") for a in argv):
        from fsdp_matrix.bisect import commits  # the commit bisect: --git REPO --good REF --bad REF

        return commits.main(argv)
    args = parser().parse_args(argv)
    if not args.by_date and None in (args.package, args.old, args.new):
        parser().error("give --package, --old and --new (or --by-date OLD_DATE NEW_DATE)")
    try:
        matrix = load_matrix(args.matrix)
        combo = matrix.combo(args.combo) if args.combo is not None else matrix.newest("cpu")
        cell = find_cell(matrix, args.cell, args.device, args.world_size)
        for option, value in (("--old", args.old), ("--new", args.new)):
            if value is not None and not args.by_date:
                _version(option, value)
        if args.by_date:
            days_between(*args.by_date)
        if args.json:
            writable_file(args.json)
        usable_dir(args.cache)
        pins = parse_pins(args.pin)
        if args.package is not None:
            if not _PROJECT.match(args.package):
                raise EnvError(f"--package {args.package!r}: not a package name")
            name = canonicalize_name(args.package)
            if name in pins:
                raise EnvError(
                    f"--pin {name}=={pins[name]}: {name} is the package being bisected (its range is --old .. --new)"
                )
        base = PinnedInstaller(combo, args.package or "peft", args.cache, pins, args.device)
        skipped = _skipped(matrix, cell, [base.pins_for(v) for v in (args.old, args.new)] if not args.by_date else [])
        if skipped:
            raise EnvError(f"{cell.key}: the cell is skipped on this combo: {skipped}")
        # each step's results and launch logs stay under the cache (cache/runs), for a look at a surprising step
        launches = LaunchRunner(
            args.cache,
            matrix=args.matrix,
            device=args.device,
            world_size=cell.world_size,
            timeout=args.timeout,
            resume=False,
            say=lambda text: None,
        )
        runner = OneCell(launches, cell.key)
        dated: Optional[DatedInstaller] = None
        if args.by_date:
            candidates: List[str] = days_between(*args.by_date)
            dated = DatedInstaller(base)
            what = "date"
        else:
            candidates = release_candidates(args.package, args.old, args.new, args.pre)
            what = args.package
        print(
            f"bisecting {cell.key} on combo {combo.id} over {len(candidates)} candidates "
            f"({what} {candidates[0]} .. {candidates[-1]}); at most {install_bound(len(candidates))} installs "
            "plus skips",
            flush=True,
        )
        with Heartbeat("bisect", "starting") as beat:
            steps: List[Step] = []

            def started(candidate: str, cells: Sequence[str]) -> None:
                beat.update(f"step {len(steps) + 1}: {what} {candidate}: installing, then running the cell", say=True)

            def ended(step: Step) -> None:
                steps.append(step)
                _progress(step)

            result = bisect(dated or base, runner, candidates, what, on_step=ended, on_start=started)
    except MatrixError as exc:
        print(f"fsdp-matrix bisect: {flat(exc)}", file=sys.stderr)
        return 2
    print(table(result))
    print(result.answer)
    data = result.to_json()
    data.update(cell=cell.key, combo=combo.id)
    if dated and result.first_changed and result.last_unchanged:
        changes = dated.changes(result.last_unchanged, result.first_changed)
        data["changed_packages"] = changes
        print(
            f"changed between {result.last_unchanged} and {result.first_changed}: " + (", ".join(changes) or "nothing")
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1, default=str))
    return 0 if result.first_changed or result.answer.startswith("no change") else 1
