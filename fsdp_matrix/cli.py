"""``python -m fsdp_matrix COMMAND``: run cells, validate matrix.yaml, rebuild reports, diff nightlies, bisect, export a
repro, bench the runner. Each command lives in its family's package and is imported only when asked for, so `report`
never imports torch."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import List, Optional

from fsdp_matrix.errors import MatrixError
from fsdp_matrix.options import OptionError
from fsdp_matrix.usage import OneLineParser, flat

# command -> module whose main(argv) implements it; imported lazily so `report` never imports torch
COMMANDS = {
    "run": "fsdp_matrix.runner.cli",
    "validate": "fsdp_matrix.cli",
    "explain": "fsdp_matrix.explain",
    "report": "fsdp_matrix.report.cli",
    "diff": "fsdp_matrix.report.diff",
    "summary": "fsdp_matrix.report.summary",
    "bisect": "fsdp_matrix.bisect.cli",
    "upgrade": "fsdp_matrix.bisect.upgrade",
    "nightly": "fsdp_matrix.bisect.nightly",
    "history": "fsdp_matrix.history.cli",
    "export": "fsdp_matrix.export.cli",
    "bench": "fsdp_matrix.runner.bench",
    "triage": "fsdp_matrix.triage.cli",
    "check": "fsdp_matrix.check.cli",
    "gate": "fsdp_matrix.gate.cli",
    "device": "fsdp_matrix.device.prepare",
}


def validate_main(argv: List[str]) -> int:
    """Check matrix.yaml; print one line naming the bad key, or one line per dead or duplicated rule, or a summary."""
    from fsdp_matrix.cells import expand
    from fsdp_matrix.lint import lint
    from fsdp_matrix.matrix import load_matrix

    p = OneLineParser(prog="fsdp_matrix validate", description=validate_main.__doc__)
    p.add_argument("matrix", nargs="?", type=Path)
    matrix = load_matrix(p.parse_args(argv).matrix)
    findings = lint(matrix)
    for finding in findings:
        print(f"fsdp_matrix validate: {finding.line()}", file=sys.stderr)
    if findings:
        return 1
    print(f"ok: {len(matrix.combos)} combos, {len(matrix.cases)} cases, {len(expand(matrix))} cells per CPU combo")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(f"usage: python -m fsdp_matrix {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    command, rest = argv[0], argv[1:]
    nul = next((arg for arg in rest if "\x00" in arg), None)
    if nul is not None:  # no shell can pass one; a caller in this process can, and no path or id holds one
        print(f"fsdp_matrix {command}: {flat(nul)[:80]}: an argument cannot hold a NUL byte", file=sys.stderr)
        return 2
    try:
        if command == "validate":
            return validate_main(rest)
        return importlib.import_module(COMMANDS[command]).main(rest)
    except (MatrixError, OptionError) as exc:
        # one line even when the message quotes an argument with a line break or a control character in it
        print(f"fsdp_matrix {command}: {flat(exc)}", file=sys.stderr)
        return 2
