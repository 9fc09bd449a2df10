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
    "docs": "fsdp_matrix.pages",
    "device": "fsdp_matrix.device.prepare",
}
HELP = {
    "run": "run cells in the current env (what nox calls through pytest)",
    "validate": "check matrix.yaml: one line per bad key, dead or copied rule",
    "explain": "every rule tried for a cell on a combo, and why one applies",
    "report": "the combined report from records (text, markdown, HTML, JSON, JUnit)",
    "diff": "the cells whose verdict changed between two result dirs; exit 1 on an alert",
    "summary": "what changed between two runs: a step-summary markdown and a short message for a chat post",
    "bisect": "the first release, date or commit that changed a cell",
    "upgrade": "which cells a version bump changes, and which release did it",
    "nightly": "diff two nights and bisect what moved",
    "history": "every night in one SQLite file; a cell x night HUD page",
    "export": "one self-contained PEP 723 script for an upstream issue",
    "bench": "batched launches vs one torchrun per cell",
    "triage": "is this traceback a known failure, and what works on my versions",
    "check": "before a launch: which known failures a user's accelerate/Trainer/PEFT configs hit, and what works",
    "gate": "a pull-request check: what HEAD changes against its merge base, and which commit",
    "docs": "check (--write: rewrite) the case counts and the cases table against matrix.yaml",
    "device": "prepare the GPU check: wheels, a plan and run.sh in one folder that travels to a GPU machine",
}
"""One line per command for ``python -m fsdp_matrix --help`` (read without importing the command's module)."""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {HELP[name]}" for name in COMMANDS]
    return "usage: python -m fsdp_matrix COMMAND [ARGS] (COMMAND --help for its options)\n\n" + "\n".join(lines)


def validate_main(argv: List[str]) -> int:
    """Check matrix.yaml; print one line naming the bad key, or one line per dead or duplicated rule, or a summary."""
    from fsdp_matrix.cells import expand
    from fsdp_matrix.lint import lint
    from fsdp_matrix.matrix import DEFAULT_MATRIX, load_matrix
    from fsdp_matrix.pages import PAGES, stale, stale_message

    p = OneLineParser(prog="fsdp_matrix validate", description=validate_main.__doc__)
    p.add_argument("matrix", nargs="?", type=Path)
    path = p.parse_args(argv).matrix
    matrix = load_matrix(path)
    lines = [finding.line() for finding in lint(matrix)]
    root = (path or DEFAULT_MATRIX).resolve().parent
    if all((root / page).is_file() for page in PAGES):  # a checkout: its docs quote matrix.yaml's figures
        behind = stale(root, matrix)
        lines += [stale_message(behind)] if behind else []
    for line in lines:
        print(f"fsdp_matrix validate: {line}", file=sys.stderr)
    if lines:
        return 1
    print(f"ok: {len(matrix.combos)} combos, {len(matrix.cases)} cases, {len(expand(matrix))} cells per CPU combo")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m fsdp_matrix {{{','.join(COMMANDS)}}} ... (--help: what each does)", file=sys.stderr)
        return 2
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
