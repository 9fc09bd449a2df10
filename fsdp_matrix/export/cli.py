"""``python -m fsdp_matrix export CELL``: one self-contained script that reproduces a cell, plus an issue snippet."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from fsdp_matrix import options
from fsdp_matrix.errors import MatrixError
from fsdp_matrix.export.script import Export, prepare, render_script
from fsdp_matrix.export.snippet import render_markdown
from fsdp_matrix.matrix import DEFAULT_MATRIX, load_matrix
from fsdp_matrix.usage import OneLineParser


def write(exp: Export, out: Path, script: Optional[Path] = None) -> List[Path]:
    script = script or out / f"{exp.stem}.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    text = render_script(exp)
    compile(text, str(script), "exec")  # a script that does not even parse must never be handed out
    script.write_text(text, encoding="utf-8")
    exp_md = script.with_suffix(".md")
    exp_md.write_text(render_markdown(exp), encoding="utf-8")
    return [script, exp_md]


def _releases(pins: List[str]) -> Dict[str, str]:
    from fsdp_matrix.bisect.installers import parse_pins  # EnvError (one line) for anything but NAME==VERSION

    return parse_pins(pins)


def main(argv: Iterable[str]) -> int:
    p = OneLineParser(prog="fsdp_matrix export", description=__doc__.split("\n\n")[0])
    p.add_argument("cell", help="CASE/CELL, or a cell id that only one case has")
    p.add_argument("--out", type=Path, default=Path("."), help="directory to write into (default: .)")
    p.add_argument("--script", type=Path, help="script path (default: OUT/repro_<case>_<cell>.py)")
    # declared once (fsdp_matrix/options.py); combo: the newest CPU one by default; results: searched for a record
    options.add_arguments(p.add_argument, ("combo", "results", "matrix"), model=options.MatrixOptions)
    p.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="NAME==VERSION",
        help="a release in place of the combo's (one no combo pins, e.g. accelerate==0.34.2); repeatable",
    )
    # no longer used (the export does not trace a run any more), still accepted so that older command lines work
    p.add_argument("--trace", choices=("auto", "always", "never"), default="auto", help=argparse.SUPPRESS)
    p.add_argument("--python", default=sys.executable, help=argparse.SUPPRESS)
    args = p.parse_args(list(argv))
    root = (args.matrix or DEFAULT_MATRIX).resolve().parent
    try:
        exp = prepare(load_matrix(args.matrix), args.cell, args.combo, args.results, root, _releases(args.pin))
        paths = write(exp, args.out, args.script)
    except OSError as exc:
        # the repro vanished after matrix.yaml was checked, or the output cannot be written: one line, no traceback
        raise MatrixError(f"{exc.filename or args.cell}: {exc.strerror or exc}") from None
    for path in paths:
        print(path)
    return 0
