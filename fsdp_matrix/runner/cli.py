"""``python -m fsdp_matrix run [CELL ...]``: cells on a batched launch without pytest (bisect steps, scripts)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List

from fsdp_matrix import options
from fsdp_matrix.cells import expand, find_cell, parse_layout
from fsdp_matrix.errors import UnknownCellError
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.verdicts import Verdict


def parser() -> options.Parser:
    p = options.Parser(prog="fsdp_matrix run", description=main.__doc__)
    p.add_argument("cells", nargs="*", help="CASE/CELL or CELL ids; none means every cell (of --cases)")
    p.add_argument(
        "--cells-file",
        type=Path,
        metavar="PATH",
        help="more ids, one a line (what bisect, upgrade and the gate pass: a list too long for a command line)",
    )
    options.add_arguments(p.add_argument)
    return p


def cell_refs(args: argparse.Namespace) -> List[str]:
    """The ids asked for: the positional ones, then those of ``--cells-file`` (blank lines skipped)."""
    if args.cells_file is None:
        return list(args.cells)
    try:
        listed = args.cells_file.read_text(encoding="utf-8").split()
    except OSError as exc:
        raise UnknownCellError(f"--cells-file {args.cells_file}: {exc.strerror or exc}") from None
    if not listed and not args.cells:
        # none would mean every cell: an empty list is not a request for the whole matrix
        raise UnknownCellError(f"--cells-file {args.cells_file}: lists no cell")
    return [*args.cells, *listed]


def main(argv: List[str]) -> int:
    """Run cells outside pytest (bisect steps, scripts). Exit 0 when every verdict passed, 1 otherwise."""
    p = parser()
    args = p.parse_args(argv)
    try:
        opts = options.from_namespace(args)
    except options.OptionError as exc:
        p.error(str(exc))
    from fsdp_matrix.runner.factory import open_session, resolve_device, run_layout

    matrix = load_matrix(opts.matrix)
    device = resolve_device(opts.device)
    world_size, nodes = run_layout(opts, device)
    try:
        selected = expand(matrix, device, world_size, opts.cases, nodes)
    except UnknownCellError as exc:
        raise UnknownCellError(f"--cases: {exc}") from None
    # an id names its own layout (-ws4-n2); a bare one without a suffix takes the run's
    refs = cell_refs(args)
    cells = [find_cell(matrix, ref, device, None if parse_layout(ref) else world_size) for ref in refs]
    cells = cells or sorted(selected, key=lambda c: c.layout != (world_size, nodes))
    if opts.cases:
        cells = [c for c in cells if c.case in opts.cases]
    if not cells:
        raise UnknownCellError(f"no cell of {', '.join(refs)} is in --cases {','.join(opts.cases or [])}")
    session = open_session(opts, matrix, launches=opts.results / "launches" / "cli")
    failed = 0
    layouts = sorted({c.layout for c in cells})
    shown = ", ".join(f"world size {ws}" + (f" on {n} nodes" if n > 1 else "") for ws, n in layouts)
    print(f"{len(cells)} cell(s) to run ({device}, {shown})", file=sys.stderr, flush=True)
    try:
        session.prefetch(cells)
        for cell in cells:
            rec = session.run(cell)
            failed += not (Verdict(rec.verdict).passed or rec.verdict == Verdict.SKIPPED.value)
            print(f"{rec.verdict:16} {rec.key}  {rec.line}", flush=True)
    finally:
        session.close()
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
