"""``python -m fsdp_matrix export CELL``: one self-contained script that reproduces a cell, plus an issue snippet."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterable, List, Optional

from fsdp_matrix.errors import MatrixError
from fsdp_matrix.export.prune import Trace
from fsdp_matrix.export.script import Export, full_script, prepare, render_script
from fsdp_matrix.export.snippet import render_markdown
from fsdp_matrix.export.trace import can_trace, trace_script
from fsdp_matrix.export.verify import judge_outcome
from fsdp_matrix.matrix import DEFAULT_MATRIX, load_matrix
from fsdp_matrix.runner import options
from fsdp_matrix.usage import OneLineParser
from fsdp_matrix.verdicts import Verdict


def trace_for(exp: Export, mode: str, python: str) -> Optional[Trace]:
    """The traced run ``mode`` asks for: ``auto`` traces when ``python`` can run the cell, ``never`` does not.

    A cell expected to fail is traced without the workload's checks first: when that run still gives the matrix's
    verdict (the expected error, reproduced), the script shows the failing steps alone. Otherwise (a check's own
    forward or state gather was part of the trigger) it is traced again with them."""
    if mode == "never" or (mode == "auto" and not can_trace(python)):
        return None
    if exp.expected.kind == "error":
        plain = trace_script(full_script(exp, checks=False).text, exp.cell.world_size, exp.cell.device, python)
        got = judge_outcome(plain.outcome, exp.expected).verdict if plain else None
        if got == Verdict.REPRODUCED:
            plain.checks = False
            return plain
        print(f"[export] without the checks the cell gave {got.value if got else 'no trace'}: traced with them")
    trace = trace_script(full_script(exp).text, exp.cell.world_size, exp.cell.device, python)
    if trace is None and mode == "always":
        raise MatrixError(f"{exp.cell.key}: the traced run of the cell failed (see above); --trace never skips it")
    return trace


def write(exp: Export, out: Path, script: Optional[Path] = None, trace: Optional[Trace] = None) -> List[Path]:
    script = script or out / f"{exp.stem}.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    text = render_script(exp, trace)
    compile(text, str(script), "exec")  # a script that does not even parse must never be handed out
    script.write_text(text, encoding="utf-8")
    exp_md = script.with_suffix(".md")
    exp_md.write_text(render_markdown(exp), encoding="utf-8")
    return [script, exp_md]


def main(argv: Iterable[str]) -> int:
    p = OneLineParser(prog="fsdp_matrix export", description=__doc__.split("\n\n")[0])
    p.add_argument("cell", help="CASE/CELL, or a cell id that only one case has")
    p.add_argument("--out", type=Path, default=Path("."), help="directory to write into (default: .)")
    p.add_argument("--script", type=Path, help="script path (default: OUT/repro_<case>_<cell>.py)")
    # declared once (runner/options.py); the combo defaults to the newest CPU one, the results are searched for a record
    options.add_arguments(p.add_argument, ("combo", "results", "matrix"), model=options.MatrixOptions)
    p.add_argument(
        "--trace",
        choices=("auto", "always", "never"),
        default="auto",
        help="run the cell once under a line tracer and keep only the lines that ran (auto: when --python has "
        "torch, peft and transformers); without it the script keeps what the cell's params reach",
    )
    p.add_argument("--python", default=sys.executable, help="interpreter of the traced run (default: this one)")
    args = p.parse_args(list(argv))
    root = (args.matrix or DEFAULT_MATRIX).resolve().parent
    try:
        exp = prepare(load_matrix(args.matrix), args.cell, args.combo, args.results, root)
        paths = write(exp, args.out, args.script, trace_for(exp, args.trace, args.python))
    except OSError as exc:
        # the repro vanished after matrix.yaml was checked, or the output cannot be written: one line, no traceback
        raise MatrixError(f"{exc.filename or args.cell}: {exc.strerror or exc}") from None
    for path in paths:
        print(path)
    return 0
