"""``python -m fsdp_matrix run [CELL ...]``: cells on a batched launch without pytest (bisect steps, scripts).

``--env installed`` runs them in this interpreter's env as the ``installed`` combo (fsdp_matrix/installed.py): what
is installed are its pins, and records are filed under it; the way upstream projects run it in their own CI."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional

from fsdp_matrix import options
from fsdp_matrix.cells import expand, find_cell, parse_layout
from fsdp_matrix.errors import UnknownCellError
from fsdp_matrix.installed import INSTALLED, uncovered
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
    p.add_argument(
        "--env",
        choices=[INSTALLED],
        help="installed: run in this interpreter's env as it is, as the combo 'installed' (its pins: what is "
        "installed, source builds with their commits); records are filed under it",
    )
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


def env_line(versions: Dict[str, Optional[str]], sources: Dict[str, Dict]) -> str:
    """``combo installed: torch 2.13.0, peft 0.14.0.dev0 @ 1a2b3c4 (rules of 0.13.2), ...``: what the cells run on."""
    from fsdp_matrix.envs.sources import shown

    parts = []
    for name, version in versions.items():
        if version is None or name == "python":
            continue
        src = sources.get(name)
        rules = f" (rules of {src.get('release') or version})" if src and src.get("commit") else ""
        parts.append(f"{name} {shown(version, src)}{rules}")
    return f"combo {INSTALLED}: " + ", ".join(parts) + f"; python {versions.get('python')}"


def main(argv: List[str]) -> int:
    """Run cells outside pytest (bisect steps, scripts). Exit 0 when every verdict passed, 1 otherwise."""
    p = parser()
    args = p.parse_args(argv)
    try:
        opts = options.from_namespace(args)
    except options.OptionError as exc:
        p.error(str(exc))
    if args.env == INSTALLED:
        if opts.combo not in (None, INSTALLED):
            p.error(f"--env installed files its records under combo {INSTALLED!r}: leave out --combo {opts.combo}")
        opts = opts.model_copy(update={"combo": INSTALLED})
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
    if args.env == INSTALLED:
        print(env_line(session.versions, session.sources), file=sys.stderr, flush=True)
    print(f"{len(cells)} cell(s) to run ({device}, {shown})", file=sys.stderr, flush=True)
    for line in uncovered((c.key, session.expected(c)) for c in cells):
        print(line, file=sys.stderr, flush=True)
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
