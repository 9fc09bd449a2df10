"""``python -m fsdp_matrix COMMAND``: run cells, rebuild reports, diff nightlies, bisect, export a repro."""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from pathlib import Path
from typing import List, Optional

from fsdp_matrix.errors import MatrixError

# command -> module whose main(argv) implements it; imported lazily so `report` never imports torch
COMMANDS = {
    "run": "fsdp_matrix.cli",
    "report": "fsdp_matrix.report",
    "diff": "fsdp_matrix.diff",
    "bisect": "fsdp_matrix.bisect_cli",
    "export": "fsdp_matrix.export",
    "bench": "fsdp_matrix.bench",
    "validate": "fsdp_matrix.cli",
}


def run_main(argv: List[str]) -> int:
    """Run cells outside pytest (bisect steps, scripts). Exit 0 when every verdict passed, 1 otherwise."""
    from fsdp_matrix.cells import expand, find_cell
    from fsdp_matrix.envs import local_versions
    from fsdp_matrix.launcher import Launcher
    from fsdp_matrix.matrix import DEFAULT_MATRIX, load_matrix
    from fsdp_matrix.session import Session
    from fsdp_matrix.verdicts import Verdict

    p = argparse.ArgumentParser(prog="fsdp_matrix run", description=run_main.__doc__)
    p.add_argument("cells", nargs="*", help="CASE/CELL or CELL ids; none means every cell")
    p.add_argument("--results", default="results", type=Path)
    p.add_argument("--matrix", default=None, type=Path)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--combo", default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--cell-timeout", type=float, default=180.0)
    p.add_argument("--torchrun-args", default="--standalone")
    args = p.parse_args(argv)
    matrix = load_matrix(args.matrix)
    cells = [find_cell(matrix, ref, args.device, args.world_size) for ref in args.cells] or \
        expand(matrix, args.device, args.world_size)
    launcher = Launcher(run_root=args.results / "launches" / "cli", device=args.device, world_size=args.world_size,
                        cell_timeout=args.cell_timeout, torchrun_args=shlex.split(args.torchrun_args))
    session = Session(matrix, launcher, args.results, local_versions(), combo=args.combo, resume=args.resume,
                      repo_root=(args.matrix or DEFAULT_MATRIX).resolve().parent)
    failed = 0
    try:
        session.prefetch(cells)
        for cell in cells:
            rec = session.run(cell)
            failed += not (Verdict(rec.verdict).passed or rec.verdict == Verdict.SKIPPED.value)
            print(f"{rec.verdict:16} {rec.key}  {rec.line}", flush=True)
    finally:
        session.close()
    return 1 if failed else 0


def validate_main(argv: List[str]) -> int:
    """Check matrix.yaml; print one line naming the bad key, or a summary."""
    from fsdp_matrix.cells import expand
    from fsdp_matrix.matrix import load_matrix

    p = argparse.ArgumentParser(prog="fsdp_matrix validate", description=validate_main.__doc__)
    p.add_argument("matrix", nargs="?", type=Path)
    matrix = load_matrix(p.parse_args(argv).matrix)
    print(f"ok: {len(matrix.combos)} combos, {len(matrix.cases)} cases, {len(expand(matrix))} cells per CPU combo")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(f"usage: python -m fsdp_matrix {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    command, rest = argv[0], argv[1:]
    try:
        if command == "run":
            return run_main(rest)
        if command == "validate":
            return validate_main(rest)
        return importlib.import_module(COMMANDS[command]).main(rest)
    except MatrixError as exc:
        print(f"fsdp_matrix {command}: {exc}", file=sys.stderr)
        return 2
