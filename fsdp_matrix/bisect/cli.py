"""``python -m fsdp_matrix bisect CELL --package NAME --old V --new V``: which release changed a cell's outcome."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence

from fsdp_matrix.bisect.installers import DatedInstaller, PinnedInstaller, days_between, parse_pins
from fsdp_matrix.bisect.releases import release_candidates
from fsdp_matrix.bisect.runner import CellRunner
from fsdp_matrix.bisect.search import BisectResult, Step, bisect, install_bound
from fsdp_matrix.cells import find_cell
from fsdp_matrix.clip import clip
from fsdp_matrix.errors import MatrixError
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.progress import Heartbeat

DEFAULT_CACHE = Path(tempfile.gettempdir()) / "fsdp-matrix-bisect"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
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
    p.add_argument("--matrix", type=Path, help="matrix.yaml (default: the repo's)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the result as JSON")
    p.add_argument("--pre", action="store_true", help="include pre-releases")
    p.add_argument(
        "--by-date",
        nargs=2,
        metavar=("OLD_DATE", "NEW_DATE"),
        help="bisect over days (YYYY-MM-DD): torch stays pinned, every other package floats to that day",
    )
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--world-size", type=int, default=None, help="ranks (default: from the cell id, else 2)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where step envs live (reused across runs)")
    p.add_argument("--timeout", type=float, default=900, help="seconds one step's run may take")
    return p


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
    if not args.by_date and not (args.package and args.old and args.new):
        parser().error("give --package, --old and --new (or --by-date OLD_DATE NEW_DATE)")
    try:
        matrix = load_matrix(args.matrix)
        combo = matrix.combo(args.combo) if args.combo else matrix.newest("cpu")
        cell = find_cell(matrix, args.cell, args.device, args.world_size)
        args.cache.mkdir(parents=True, exist_ok=True)
        base = PinnedInstaller(combo, args.package or "peft", args.cache, parse_pins(args.pin), args.device)
        # each step's results and launch logs stay under the cache, for a look at a surprising step
        (args.cache / "runs").mkdir(exist_ok=True)
        runner = CellRunner(cell.key, args.device, cell.world_size, args.matrix, args.timeout, args.cache / "runs")
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
        print(f"fsdp-matrix bisect: {exc}", file=sys.stderr)
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
