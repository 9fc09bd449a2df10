"""The gate's confirm step: every changed cell is rerun in fresh launches, at the head and at the base, before it
counts (fsdp_matrix.confirm decides; this module only gives it the gate's reruns).

The head's sources always moved from the base's, so both ends are rerun: a change that repeats at the head and
whose base reruns still give the base's verdict is the pull request's doing; one that does not repeat, or that the
base now gives too, is listed as flaky and neither fails the gate nor is bisected. A change no rerun could judge (the
env could not be rebuilt) still counts, as the nightly counts it.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

from fsdp_matrix.confirm import FLAKY, NOT_THE_SOURCES, TONIGHT, Flip, RerunAsk, confirm
from fsdp_matrix.gate.changes import CellChange, Confirmation, ConfirmContext


def rerun_changes(changes: Sequence[CellChange], ctx: ConfirmContext) -> Confirmation:
    """The default confirm step of ``flow.run_gate``: 2 fresh launches at the head and 2 at the base per combo."""
    if not changes:
        return Confirmation()

    def rerun(ask: RerunAsk) -> Dict[str, Optional[str]]:
        commit = ctx.head if ask.at == TONIGHT else ctx.base
        got = ctx.runs.run(ctx.combos[ask.column], commit, list(ask.cells), fresh=True)
        return {cell: (seen.verdict if seen.outcome else None) for cell, seen in got.cells.items()}

    flips = [Flip(c.combo, c.cell, c.base.verdict, c.head.verdict) for c in changes]
    result = confirm(flips, rerun, moved=sorted({f.column for f in flips}))
    out = Confirmation(reruns=result.cell_runs)
    for change in changes:
        status = result.status(change.combo, change.cell)
        (out.flaky if status in (FLAKY, NOT_THE_SOURCES) else out.confirmed).append(change)
    return out
