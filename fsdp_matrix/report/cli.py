"""``python -m fsdp_matrix report RESULTS``: every format of the report, written next to the records."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from fsdp_matrix import options
from fsdp_matrix.errors import MatrixError
from fsdp_matrix.matrix import DEFAULT_MATRIX, Matrix, load_matrix
from fsdp_matrix.report.grid import Grid, load_grid
from fsdp_matrix.report.html import render_html
from fsdp_matrix.report.json import to_json
from fsdp_matrix.report.junit import junit_name, junit_xml
from fsdp_matrix.report.markdown import append_step_summary, render_markdown
from fsdp_matrix.report.text import one_line, render_text
from fsdp_matrix.usage import OneLineParser, flat

FORMATS = ("text", "md", "html", "json", "junit")


def write_reports(grid: Grid, out: Path, formats: Sequence[str] = FORMATS) -> List[Path]:
    """Write the chosen formats into ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written: Dict[str, str] = {}
    if "text" in formats:
        written["report.txt"] = render_text(grid)
    if "md" in formats:
        written["report.md"] = render_markdown(grid)
    if "html" in formats:
        written["report.html"] = render_html(grid)
    if "json" in formats:
        written["report.json"] = json.dumps(to_json(grid), indent=1, sort_keys=True, default=str) + "\n"
    paths = []
    for name, text in written.items():
        (out / name).write_text(text, encoding="utf-8")
        paths.append(out / name)
    if "junit" in formats:
        for col in grid.columns:
            (out / junit_name(col)).write_bytes(junit_xml(grid, col))
            paths.append(out / junit_name(col))
    return paths


def prune(results: Path, keys: set) -> int:
    """Move the records of ``keys`` (``case/cell``) out of every cells.jsonl under ``results`` into the
    cells.pruned.jsonl beside it (nothing is deleted; a line that is not a record stays where it was). Returns how
    many records moved."""
    files = [results] if results.is_file() else sorted(results.rglob("cells.jsonl"))
    moved = 0
    for path in files:
        keep, out = [], []
        for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
            try:
                data = json.loads(line)
                key = f"{data['case']}/{data['cell']}"
            except (ValueError, TypeError, KeyError):
                key = None
            (out if key in keys else keep).append(line)
        if out:
            with open(path.with_name("cells.pruned.jsonl"), "a", encoding="utf-8") as fh:
                fh.writelines(out)
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(keep), encoding="utf-8")
            tmp.replace(path)
            moved += len(out)
    return moved


def _matrix_for(path: Optional[Path]) -> Optional[Matrix]:
    """matrix.yaml only orders rows and columns, so the repo's own is used when none is named and it loads."""
    if path is not None:
        return load_matrix(path, check_repros=False)
    if DEFAULT_MATRIX.exists():
        try:
            return load_matrix(DEFAULT_MATRIX, check_repros=False)
        except MatrixError as exc:
            print(f"report: ignoring {DEFAULT_MATRIX} for ordering: {flat(exc)}", file=sys.stderr)
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m fsdp_matrix report RESULTS [--out DIR] [--matrix FILE] [--format F ...]``; argv excludes 'report'."""
    parser = OneLineParser(
        prog="python -m fsdp_matrix report", description="Combine cells.jsonl records into one grid of cells x combos."
    )
    parser.add_argument("results", type=Path, help="results dir (every cells.jsonl under it) or one cells.jsonl")
    parser.add_argument("--out", type=Path, help="where to write the reports (default: RESULTS, or its folder)")
    options.add_arguments(
        parser.add_argument, ("matrix",), model=options.MatrixOptions
    )  # declared once (fsdp_matrix/options.py)
    parser.add_argument(
        "--format",
        action="append",
        choices=FORMATS,
        dest="formats",
        help="format to write; repeat for several (default: all)",
    )
    parser.add_argument(
        "--prune",
        action="store_true",
        help="move the records of cells matrix.yaml no longer has into cells.pruned.jsonl beside each cells.jsonl",
    )
    args = parser.parse_args(argv)
    try:
        grid = load_grid(args.results, _matrix_for(args.matrix))
        if args.prune and grid.gone:
            moved = prune(args.results, set(grid.gone))
            print(f"report: moved {moved} records of {len(grid.gone)} cells not in matrix.yaml to cells.pruned.jsonl")
            grid = load_grid(args.results, _matrix_for(args.matrix))
    except (OSError, MatrixError) as exc:
        print(f"report: {flat(exc)}", file=sys.stderr)
        return 2
    if not grid.rows:
        # one line: what is wrong with the input, with the first unreadable line as the example
        first = f", e.g. {one_line(str(grid.skipped[0]), 200)}" if grid.skipped else ""
        print(
            f"report: no cell records in {flat(args.results)}"
            + (f"; {grid.skipped_text()}{first}" if grid.skipped else ""),
            file=sys.stderr,
        )
        return 2
    for skip in grid.skipped:
        print(f"report: {one_line(str(skip))}", file=sys.stderr)
    out = args.out or (args.results if args.results.is_dir() else args.results.parent)
    try:
        paths = write_reports(grid, out, args.formats or FORMATS)
    except OSError as exc:
        print(f"report: cannot write to {flat(out)}: {flat(exc)}", file=sys.stderr)
        return 2
    sys.stdout.write(render_text(grid))
    if args.formats is None or "md" in args.formats:
        append_step_summary(render_markdown(grid))
    print(f"\nwrote {len(paths)} files to {out}")
    return 0
