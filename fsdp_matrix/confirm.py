"""Confirm before alerting: a cell whose verdict flipped is rerun before the flip counts.

A hang under load or a rank the OOM killer took flips a cell for one night; alerting on it rings the on-call and
sends a bisect after a ghost. So each flipped cell is rerun ``runs`` times (at least 2), each time in a fresh launch
in the same env, and, when the sources moved between the nights, as many times at last night's commits too (as
transformers' nightly reruns a new failure at the previous commit before bisecting it:
https://github.com/huggingface/transformers/blob/main/utils/check_bad_commit.py). The flip then is:

- ``confirmed``: every rerun tonight gave tonight's verdict (and every rerun at last night's commits gave last
  night's): it alerts as the diff says, and may be bisected;
- ``flaky``: a rerun tonight did not repeat it (or last night's commits gave mixed verdicts): listed apart, no
  alert, nothing bisected;
- ``not-the-sources``: it repeats tonight and at last night's commits too: real, so it alerts, but the commits that
  moved did not cause it, and a commit bisect would find nothing;
- ``unconfirmed``: no rerun left a verdict (the env could not be rebuilt): nothing refutes the flip, so it alerts,
  and nothing is bisected.

The decision (``decide``) is pure; the reruns come from a callback (``Rerun``), so the nightly and the pull-request
gate share it and tests drive it without an env.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from fsdp_matrix.records import Confirmation

RUNS = 2
"""Reruns of each flipped cell, per place it is rerun (tonight's env; last night's commits when the sources moved)."""
CONFIRMED, FLAKY, NOT_THE_SOURCES, UNCONFIRMED = "confirmed", "flaky", "not-the-sources", "unconfirmed"
ALERTING = (CONFIRMED, NOT_THE_SOURCES, UNCONFIRMED)
"""The statuses whose flip still alerts (when the diff calls it an alert); only CONFIRMED is bisected."""
TONIGHT, PREVIOUS = "tonight", "previous"


@dataclass(frozen=True)
class Flip:
    """One cell whose verdict changed between the previous run and this one."""

    column: str
    """Combo column id."""
    cell: str
    """``case/cell``."""
    old: Optional[str]
    """The previous run's verdict (None: no record)."""
    new: Optional[str]
    """This run's verdict."""


@dataclass(frozen=True)
class RerunAsk:
    """One fresh launch of some flipped cells of one column."""

    column: str
    """Combo column id: the env is that column's, as it ran this time."""
    cells: Tuple[str, ...]
    """``case/cell`` of each cell to rerun (they share the launch)."""
    at: str
    """TONIGHT (the env as it ran) or PREVIOUS (the same env with the moved sources at the previous run's commits)."""
    attempt: int
    """1-based number of this rerun at ``at``."""


Rerun = Callable[[RerunAsk], Mapping[str, Optional[str]]]
"""Runs the cells of an ask in a fresh launch; each cell's verdict (a cell it has no record of may be left out)."""


@dataclass
class Confirmed:
    """Every flip of a night with what its reruns said, and what the reruns cost."""

    flips: Dict[Tuple[str, str], Confirmation] = field(default_factory=dict)
    """(column, case/cell) -> the flip's confirmation."""
    launches: int = 0
    """Fresh launches the reruns took."""
    cell_runs: int = 0
    """Cell runs over those launches."""

    def status(self, column: str, cell: str) -> Optional[str]:
        found = self.flips.get((column, cell))
        return found.status if found else None

    def with_status(self, *statuses: str) -> List[Tuple[str, str]]:
        return [key for key, c in self.flips.items() if c.status in statuses]


def decide(flip: Flip, reruns: Sequence[Optional[str]], at_previous: Sequence[Optional[str]] = ()) -> Confirmation:
    """The status of ``flip`` from its reruns tonight and, when the sources moved, at last night's commits."""
    ran = [v for v in reruns if v is not None]
    if not ran:
        status = UNCONFIRMED
    elif any(v != flip.new for v in ran):
        status = FLAKY
    elif not at_previous or all(v == flip.old for v in at_previous):
        status = CONFIRMED
    elif all(v == flip.new for v in at_previous):
        status = NOT_THE_SOURCES
    else:
        status = FLAKY
    return Confirmation(status=status, previous=flip.old, reruns=list(reruns), at_previous=list(at_previous))


def _rerun_all(column: str, cells: Tuple[str, ...], at: str, runs: int, rerun: Rerun, out: Confirmed) -> List[Dict]:
    answers = []
    for attempt in range(1, runs + 1):
        got = dict(rerun(RerunAsk(column, cells, at, attempt)))
        out.launches += 1
        out.cell_runs += len(cells)
        answers.append(got)
    return answers


def confirm(flips: Sequence[Flip], rerun: Rerun, moved: Sequence[str] = (), runs: int = RUNS) -> Confirmed:
    """Rerun every flip ``runs`` times in fresh launches, one launch per column and attempt; the columns of
    ``moved`` (their sources moved) also ``runs`` times at the previous commits."""
    if runs < 2:
        raise ValueError(f"a flip is confirmed by at least 2 reruns, not {runs}")
    out = Confirmed()
    for column in sorted({f.column for f in flips}):
        mine = [f for f in flips if f.column == column]
        cells = tuple(f.cell for f in mine)
        tonight = _rerun_all(column, cells, TONIGHT, runs, rerun, out)
        before = _rerun_all(column, cells, PREVIOUS, runs, rerun, out) if column in moved else []
        for f in mine:
            out.flips[(column, f.cell)] = decide(f, [a.get(f.cell) for a in tonight], [b.get(f.cell) for b in before])
    return out


def cost_note(confirmed: Confirmed) -> str:
    """What the reruns cost, for the night's summary."""
    counts = {s: len(confirmed.with_status(s)) for s in (CONFIRMED, FLAKY, NOT_THE_SOURCES, UNCONFIRMED)}
    said = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "nothing to confirm"
    return (
        f"Confirmation: {len(confirmed.flips)} flipped cells rerun ({said}): {confirmed.launches} fresh launches, "
        f"{confirmed.cell_runs} cell runs."
    )
