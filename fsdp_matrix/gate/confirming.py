"""The gate's confirm step: every changed cell is rerun in fresh launches, at the head and at the base, before it
counts (fsdp_matrix.confirm schedules the reruns and ``decide_gate`` reads them; this module gives it the gate's
reruns and turns its call into the change that counts).

The head's sources always moved from the base's, so both ends are rerun, and the change is judged against what the
base *reruns* give: the base's first run may be a flake read back from the cache, and a flake there must neither hide
a regression nor invent one. A change is flaky only when the head does not repeat; a head that fails in some of its
runs where no base run fails was made flaky by the pull request, and fails the gate (not bisected: a search needs an
answer that repeats). A change the base reruns give too is not the pull request's doing: listed apart with the
flaky ones. A change no rerun could judge (the env could not be rebuilt) still counts, as the nightly counts it.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

from fsdp_matrix.confirm import (
    CONFIRMED,
    MADE_FLAKY,
    PREVIOUS,
    RUNS,
    TONIGHT,
    UNCONFIRMED,
    Flip,
    RerunAsk,
    confirm,
    decide_gate,
)
from fsdp_matrix.gate import changes as kinds
from fsdp_matrix.gate.changes import CellChange, Confirmation, ConfirmContext
from fsdp_matrix.gate.runs import Seen

Token = Tuple[Hashable, ...]
"""What a run of a cell did, comparable: status, error type, normalised message and verdict."""


def token(seen: Seen) -> Token:
    o = seen.outcome
    return (o.status, o.error_type, o.message, o.verdict) if o else ("env-error", None, None, "env-error")


def _failing(tok: Token) -> bool:
    # a head run that skips the cell does not exercise it: as much a failure, for "made flaky", as an error
    return kinds.failing(str(tok[3])) or tok[3] == "skipped"


def _rejudged(change: CellChange, status: str, base: Seen) -> CellChange:
    """The change as it counts: against the base the reruns give, or ``made-flaky``."""
    if status == MADE_FLAKY:
        return dataclasses.replace(change, base=base, kind=kinds.MADE_FLAKY)
    return dataclasses.replace(change, base=base, kind=kinds.kind_of(base.verdict, change.head.verdict))


def rerun_changes(changes: Sequence[CellChange], ctx: ConfirmContext) -> Confirmation:
    """The default confirm step of ``flow.run_gate``: 2 fresh launches at the head and 2 at the base per combo."""
    if not changes:
        return Confirmation()
    got: Dict[Tuple[str, int, str, str], Seen] = {}

    def rerun(ask: RerunAsk) -> Dict[str, Optional[str]]:
        commit = ctx.head if ask.at == TONIGHT else ctx.base
        at = ctx.runs.run(ctx.combos[ask.column], commit, list(ask.cells), fresh=True)
        got.update({(ask.at, ask.attempt, ask.column, cell): seen for cell, seen in at.cells.items()})
        return {cell: (seen.verdict if seen.outcome else None) for cell, seen in at.cells.items()}

    flips = [Flip(c.combo, c.cell, c.base.verdict, c.head.verdict) for c in changes]
    result = confirm(flips, rerun, moved=sorted({f.column for f in flips}))
    out = Confirmation(reruns=result.cell_runs)
    for change in changes:
        reruns = {at: _ran(got, at, change) for at in (TONIGHT, PREVIOUS)}
        seen = {token(s): s for s in [change.base, *reruns[PREVIOUS]]}
        call = decide_gate(
            token(change.base),
            token(change.head),
            [token(s) for s in reruns[PREVIOUS]],
            [token(s) for s in reruns[TONIGHT]],
            _failing,
        )
        if call.status in (CONFIRMED, UNCONFIRMED, MADE_FLAKY):
            out.confirmed.append(_rejudged(change, call.status, seen[call.base]))
        else:
            out.flaky.append(change)
    return out


def _ran(got: Dict[Tuple[str, int, str, str], Seen], at: str, change: CellChange) -> List[Seen]:
    """The reruns of ``change`` at ``at`` that left a result."""
    runs = [got.get((at, attempt, change.combo, change.cell)) for attempt in range(1, RUNS + 1)]
    return [s for s in runs if s is not None and s.outcome is not None]
