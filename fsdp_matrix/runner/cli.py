"""``python -m fsdp_matrix run [CELL ...]``: cells on a batched launch without pytest (bisect steps, scripts)."""

from __future__ import annotations

import sys
from typing import List

from fsdp_matrix.cells import expand, find_cell
from fsdp_matrix.errors import UnknownCellError
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.runner import options
from fsdp_matrix.verdicts import Verdict


def parser() -> options.Parser:
    p = options.Parser(prog="fsdp_matrix run", description=main.__doc__)
    p.add_argument("cells", nargs="*", help="CASE/CELL or CELL ids; none means every cell (of --cases)")
    options.add_arguments(p.add_argument)
    return p


def main(argv: List[str]) -> int:
    """Run cells outside pytest (bisect steps, scripts). Exit 0 when every verdict passed, 1 otherwise."""
    p = parser()
    args = p.parse_args(argv)
    try:
        opts = options.from_namespace(args)
    except options.OptionError as exc:
        p.error(str(exc))
    from fsdp_matrix.runner.factory import open_session, resolve_device, resolve_world_size

    matrix = load_matrix(opts.matrix)
    device = resolve_device(opts.device)
    world_size = resolve_world_size(opts.world_size, device)
    try:
        selected = expand(matrix, device, world_size, opts.cases)
    except UnknownCellError as exc:
        raise UnknownCellError(f"--cases: {exc}") from None
    cells = [find_cell(matrix, ref, device, world_size) for ref in args.cells] or selected
    if opts.cases:
        cells = [c for c in cells if c.case in opts.cases]
    if not cells:
        raise UnknownCellError(f"no cell of {', '.join(args.cells)} is in --cases {','.join(opts.cases or [])}")
    session = open_session(opts, matrix, launches=opts.results / "launches" / "cli")
    failed = 0
    print(f"{len(cells)} cell(s) to run ({device}, world size {world_size})", file=sys.stderr, flush=True)
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
