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

The pull-request gate reads the same reruns more strictly (``decide_gate``): a change is flaky only when the *head*
does not repeat, and is judged against what the base reruns give, not against the base's first run (which a gate
reads back from its cache, flake and all). A head that fails in some of its runs where no base run fails is
``made-flaky``: a pull request must not make a cell flaky, so it fails the gate (the nightly still calls it flaky).

The decisions (``decide``, ``decide_gate``) are pure; the reruns come from a callback (``Rerun``), so the nightly
and the pull-request gate share it and tests drive it without an env.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Generic, Hashable, List, Mapping, Optional, Sequence, Tuple, TypeVar

from fsdp_matrix.records import Confirmation

RUNS = 2
"""Reruns of each flipped cell, per place it is rerun (tonight's env; last night's commits when the sources moved)."""
CONFIRMED, FLAKY, NOT_THE_SOURCES, UNCONFIRMED = "confirmed", "flaky", "not-the-sources", "unconfirmed"
ALERTING = (CONFIRMED, NOT_THE_SOURCES, UNCONFIRMED)
"""The statuses whose flip still alerts (when the diff calls it an alert); only CONFIRMED is bisected."""
TONIGHT, PREVIOUS = "tonight", "previous"
MADE_FLAKY = "made-flaky"
"""The gate's reading only: the head does not repeat, and some head run fails where no base run does."""
T = TypeVar("T", bound=Hashable)


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


@dataclass(frozen=True)
class GateCall(Generic[T]):
    """What the gate makes of one change from its first runs and its reruns at both ends."""

    status: str
    """CONFIRMED, UNCONFIRMED (no head rerun ran), NOT_THE_SOURCES (the base gives the head's result too), FLAKY
    (the head does not repeat, and fails nowhere the base does not) or MADE_FLAKY (it fails where the base never
    does)."""
    base: T
    """What the base gives, from its reruns (the first passing one when they disagree); its first run only when no
    rerun ran. The change is judged against this, not against the first base run."""


def decide_gate(
    first_base: T,
    first_head: T,
    base_reruns: Sequence[Optional[T]],
    head_reruns: Sequence[Optional[T]],
    failing: Callable[[T], bool],
) -> GateCall[T]:
    """The gate's status of a change seen as ``first_base`` -> ``first_head``, from fresh reruns at both ends (None:
    a rerun that left no result); ``failing`` says which results fail (the base's kind of change aside)."""
    bases = [v for v in base_reruns if v is not None] or [first_base]
    heads = [first_head, *(v for v in head_reruns if v is not None)]
    base = next((b for b in bases if not failing(b)), bases[0])
    if len(set(heads)) > 1:
        made = any(failing(h) for h in heads) and not any(failing(b) for b in bases)
        return GateCall(MADE_FLAKY if made else FLAKY, base)
    if first_head in bases:
        return GateCall(NOT_THE_SOURCES, first_head)
    return GateCall(CONFIRMED if len(heads) > 1 else UNCONFIRMED, base)


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
