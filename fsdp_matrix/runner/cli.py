"""``python -m fsdp_matrix run [CELL ...]``: cells on a batched launch without pytest (bisect steps, scripts)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import List

from fsdp_matrix.cells import expand, find_cell
from fsdp_matrix.envs import local_versions
from fsdp_matrix.errors import UnknownCellError
from fsdp_matrix.matrix import DEFAULT_MATRIX, load_matrix
from fsdp_matrix.runner.launcher import Launcher
from fsdp_matrix.runner.session import Session
from fsdp_matrix.verdicts import Verdict


def main(argv: List[str]) -> int:
    """Run cells outside pytest (bisect steps, scripts). Exit 0 when every verdict passed, 1 otherwise."""
    p = argparse.ArgumentParser(prog="fsdp_matrix run", description=main.__doc__)
    p.add_argument("cells", nargs="*", help="CASE/CELL or CELL ids; none means every cell (of --cases)")
    p.add_argument("--cases", default=None, help="comma-separated case ids: run only their cells")
    p.add_argument("--results", default="results", type=Path)
    p.add_argument("--matrix", default=None, type=Path)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--combo", default=None)
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep cells whose newest record is an outcome; re-run env-error, hang, crash",
    )
    p.add_argument("--cell-timeout", type=float, default=180.0)
    p.add_argument("--torchrun-args", default="--standalone")
    args = p.parse_args(argv)
    matrix = load_matrix(args.matrix)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()] if args.cases else None
    try:
        selected = expand(matrix, args.device, args.world_size, cases)
    except UnknownCellError as exc:
        raise UnknownCellError(f"--cases: {exc}") from None
    cells = [find_cell(matrix, ref, args.device, args.world_size) for ref in args.cells] or selected
    if cases:
        cells = [c for c in cells if c.case in cases]
    if not cells:
        raise UnknownCellError(f"no cell of {', '.join(args.cells)} is in --cases {args.cases}")
    launcher = Launcher(
        run_root=args.results / "launches" / "cli",
        device=args.device,
        world_size=args.world_size,
        cell_timeout=args.cell_timeout,
        torchrun_args=shlex.split(args.torchrun_args),
    )
    session = Session(
        matrix,
        launcher,
        args.results,
        local_versions(),
        combo=args.combo,
        resume=args.resume,
        repo_root=(args.matrix or DEFAULT_MATRIX).resolve().parent,
    )
    failed = 0
    print(f"{len(cells)} cell(s) to run ({args.device}, world size {args.world_size})", file=sys.stderr, flush=True)
    try:
        session.prefetch(cells)
        for cell in cells:
            rec = session.run(cell)
            failed += not (Verdict(rec.verdict).passed or rec.verdict == Verdict.SKIPPED.value)
            print(f"{rec.verdict:16} {rec.key}  {rec.line}", flush=True)
    finally:
        session.close()
    return 1 if failed else 0
