"""``check --run``: the cells the setup matches, run here in the current env through the runner (the same records,
the same verdicts as ``python -m fsdp_matrix run``), so that the answer for the installed versions comes from a run,
not from the rules alone. The cells run on this machine's CPU at their own layout (2 ranks, gloo)."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from typing import Any, List, TextIO

from fsdp_matrix.check.match import match
from fsdp_matrix.check.setup import Setup
from fsdp_matrix.installed import installed_versions
from fsdp_matrix.matrix import Matrix
from fsdp_matrix.rules import RULE_PACKAGES


def matching_cells(matrix: Matrix, setup: Setup) -> List[str]:
    """``case/cell`` of every CPU cell the setup matches, on the installed versions."""
    here = dataclasses.replace(setup, device="cpu")
    found = match(matrix, here, installed_versions(RULE_PACKAGES))
    return sorted({c.key for m in found for c in m.cells})


def run_matching(matrix: Matrix, setup: Setup, args: Any, out: TextIO) -> int:
    """Run the matching cells through ``fsdp_matrix.runner.cli``; its exit status (1: a verdict needs attention)."""
    from fsdp_matrix.runner import cli as runner

    keys = matching_cells(matrix, setup)
    if not keys:
        print("check --run: no cell matches these settings: nothing to run", file=out, flush=True)
        return 0
    print(f"check --run: {len(keys)} matching cell(s), in this env, records in {args.run_results}", file=out,
          flush=True)  # fmt: skip
    argv = [*keys, "--results", str(args.run_results), "--device", "cpu"]
    if args.matrix is not None:
        argv += ["--matrix", str(args.matrix)]
    # the runner prints a verdict line per cell on stdout: under --json they go beside the JSON, on stderr
    quiet = contextlib.redirect_stdout(sys.stderr) if out is sys.stderr else contextlib.nullcontext()
    with quiet:
        return runner.main(argv)
