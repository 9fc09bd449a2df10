"""What changed between base and head, and how each change counts.

A cell changed when what it did differs (status, error type, normalised message: bisect/commits.py's comparison)
or its verdict does. A change fails the gate when the head breaks what held at the base: a fix that stopped holding
(fix-holds at the base), a new failure (a reproduced bug that now fails another way, a cell that now hangs,
crashes or does not build), or a cell that is now skipped (no longer exercised). A cell that now trains where a
reported error was expected (UNEXPECTED-FIX) is listed, but passes: the pull request fixed a reported bug, and
matrix.yaml needs a new rule.

Between the changes and the bisect sits the confirm step (``Confirm``): it may rerun each changed cell and keep
only the changes that repeat; the others are reported as flaky, and neither fail the gate nor get bisected, except
a cell the head made flaky (MADE_FLAKY), which fails and is not bisected. The default confirms every change as
seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Protocol, Sequence

from fsdp_matrix.bisect.commits import same_observation
from fsdp_matrix.gate.runs import AtCommit, CellRuns, Seen
from fsdp_matrix.matrix import Combo
from fsdp_matrix.verdicts import Verdict

FIX_BROKEN = "fix-broken"
NEW_FAILURE = "new-failure"
NOW_TRAINS = "now-trains"
FIXED = "fixed"
CHANGED = "changed"
MADE_FLAKY = "made-flaky"
NOW_SKIPPED = "now-skipped"
FAILING_KINDS = (FIX_BROKEN, NEW_FAILURE, MADE_FLAKY, NOW_SKIPPED)
"""The kinds of change that fail the gate."""
KIND_TEXT = {
    FIX_BROKEN: "a fix stopped holding",
    NEW_FAILURE: "new failure",
    NOW_TRAINS: "trains where a reported error was expected (update matrix.yaml)",
    FIXED: "passes now",
    CHANGED: "changed",
    NOW_SKIPPED: "skipped at the head (no longer exercised)",
    MADE_FLAKY: "made flaky (fails in some head runs, in no base run; not bisected)",
}
_PASSED = (Verdict.REPRODUCED.value, Verdict.FIX_HOLDS.value)
_NOT_FAILING = (*_PASSED, Verdict.SKIPPED.value, Verdict.UNEXPECTED_FIX.value)


def failing(verdict: str) -> bool:
    """A verdict that fails where the base passed (a hang, a crash, an error, an env that did not build)."""
    return verdict not in _NOT_FAILING


@dataclass(frozen=True)
class CellChange:
    """One cell of one combo that did something else at the head than at the base."""

    combo: str
    """The combo's id."""
    cell: str
    """``case/cell``."""
    base: Seen
    """What it did at the base."""
    head: Seen
    """What it did at the head."""
    kind: str
    """FIX_BROKEN, NEW_FAILURE, NOW_SKIPPED, NOW_TRAINS, FIXED, CHANGED, or MADE_FLAKY (the confirm step's)."""

    @property
    def fails(self) -> bool:
        """This change fails the gate."""
        return self.kind in FAILING_KINDS


def _differs(a: Seen, b: Seen) -> bool:
    if a.outcome is None or b.outcome is None:
        return (a.outcome is None) != (b.outcome is None)
    return not same_observation(a.outcome, b.outcome) or a.verdict != b.verdict


def kind_of(base: str, head: str) -> str:
    """How a change from verdict ``base`` to verdict ``head`` counts."""
    fails = failing(head)
    if head == Verdict.SKIPPED.value and base != head:
        # a cell the pull request stopped exercising (a requirement it no longer meets, a new error judged as a
        # platform's): nothing says the fix still holds
        return NOW_SKIPPED
    if base == Verdict.FIX_HOLDS.value and fails:
        return FIX_BROKEN
    if head == Verdict.UNEXPECTED_FIX.value:
        return NOW_TRAINS
    if fails and (base in _PASSED or base == Verdict.SKIPPED.value):
        return NEW_FAILURE
    if head in _PASSED and base not in _PASSED:
        return FIXED
    return CHANGED


@dataclass(frozen=True)
class NotJudged:
    """One cell of one combo with no result at the base or at the head: nothing says what the pull request did to
    it, so it never counts as "no change" (an absence is never a pass)."""

    combo: str
    """The combo's id."""
    cell: str
    """``case/cell``."""
    why: str
    """At which end the result is missing, and why (no record, the launch's backstop ran out, an env-error)."""


def _missing_at(was: Seen, now: Seen, head_built: bool) -> List[str]:
    # a head that does not build is the pull request's doing: a change (it fails), not an absence
    ends = [("base", was)] if was.outcome is None else []
    if now.outcome is None and head_built:
        ends.append(("head", now))
    return [f"no result at the {end}: {seen.why}" for end, seen in ends]


def not_judged(base: AtCommit, head: AtCommit) -> List[NotJudged]:
    """The cells of one combo that have no result at the base, or at a head that built, in cell order."""
    out = []
    for cell, was in base.cells.items():
        why = _missing_at(was, head.cells.get(cell, Seen(None, "not run")), head.built)
        if why:
            out.append(NotJudged(base.combo, cell, "; ".join(why)))
    return out


def changed_cells(base: AtCommit, head: AtCommit) -> List[CellChange]:
    """The judged cells of one combo whose outcome or verdict differs between base and head, in cell order (a
    cell without a result at either end is ``not_judged``, never a change nor "no change")."""
    out = []
    for cell, was in base.cells.items():
        now = head.cells.get(cell, Seen(None, "not run"))
        if not _missing_at(was, now, head.built) and _differs(was, now):
            out.append(CellChange(base.combo, cell, was, now, kind_of(was.verdict, now.verdict)))
    return out


@dataclass
class Confirmation:
    """What the confirm step made of the changes."""

    confirmed: List[CellChange] = field(default_factory=list)
    """Changes that repeat: these count, and are bisected."""
    flaky: List[CellChange] = field(default_factory=list)
    """Changes that did not repeat: listed apart, never failing, never bisected."""
    reruns: int = 0
    """Cell runs the confirm step spent."""


@dataclass(frozen=True)
class ConfirmContext:
    """What a confirm step may use to rerun a change: the runs, the combos and the two commits."""

    runs: CellRuns
    """Runs cells at a commit (``fresh=True``: a new launch, not the cached records)."""
    combos: Dict[str, Combo]
    """Combo id -> combo, for every combo gated."""
    base: str
    """The base's full SHA."""
    head: str
    """The head's full SHA."""


class Confirm(Protocol):
    """The confirm step: which changes repeat. Plugged into ``flow.run_gate(confirm=...)``."""

    def __call__(self, changes: Sequence[CellChange], ctx: ConfirmContext) -> Confirmation: ...


def as_seen(changes: Sequence[CellChange], ctx: ConfirmContext) -> Confirmation:
    """The default confirm step: every change counts as seen once."""
    return Confirmation(list(changes))
