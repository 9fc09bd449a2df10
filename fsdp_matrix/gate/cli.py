"""``python -m fsdp_matrix gate --pin NAME=PATH_OR_URL[@HEAD] [--base REF] [--combos IDS] [--cases IDS]``: what
``nox -s gate`` runs. Exit 0 when nothing fails; 1 on a failing change (a new failure, a fix that stopped holding, a
cell made flaky or skipped) in any combo judged, or on cells with no result at either end (beyond --allow-missing);
2 for bad input (one line) or a combo whose base cannot be run (and no failing change elsewhere); 130/143 when
interrupted or terminated."""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, Optional, Sequence

from fsdp_matrix.bisect.runner import stopped_by_signal
from fsdp_matrix.errors import MatrixError
from fsdp_matrix.gate.flow import run_gate
from fsdp_matrix.gate.request import PROG, from_args, parser, redacted
from fsdp_matrix.gate.summary import markdown, to_json
from fsdp_matrix.paths import writable_file
from fsdp_matrix.usage import flat


def main(argv: Optional[Sequence[str]] = None, **collaborators) -> int:
    """``collaborators``: run_gate's ``runs``, ``confirm`` and ``bisect`` (a test's fakes; the real ones by default).
    Ctrl-C and SIGTERM (a cancelled CI job) end the running launch and the gate in one line, exit 130 / 143."""
    return stopped_by_signal(PROG, lambda: _main(argv, collaborators))


def _main(argv: Optional[Sequence[str]], collaborators: Dict[str, Any]) -> int:
    args = parser().parse_args(argv)
    try:
        req = from_args(args)
        for path, what in ((req.json, "--json"), (req.summary, "--summary")):
            if path:
                writable_file(path, what)
        result = run_gate(req, **collaborators)
    except MatrixError as exc:
        print(f"{PROG}: {redacted(flat(exc))}", file=sys.stderr)  # a pin's credentials never reach the CI log
        return 2
    text = markdown(result)
    print(text, flush=True)
    if req.summary:
        with open(req.summary, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")
    if req.json:
        req.json.write_text(json.dumps(to_json(result), indent=1, default=str))
    return result.exit_code
