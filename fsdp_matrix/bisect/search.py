"""Bisection: find the first candidate (release or date) whose observed outcome differs from the old one's.

The search knows nothing about packages or processes. It talks to two collaborators given as Protocols (the way
pytest-xdist types its scheduler): an Installer prepares an env for a candidate or says why it cannot (the
``git bisect skip`` / exit 125 case), and a Runner runs cells in that env and returns the observed Outcomes.
Both directions work: "first changed" is the first candidate whose outcome differs from OLD's, whether that is
a bug appearing or a fix landing.

One search serves several cells (``bisect_cells``): each cell keeps its own interval, and a step installs one
candidate once and runs every unresolved cell whose interval holds it in one launch. Cells that changed at the same
release share every step, so k such cells cost one bisection's installs, not k. ``bisect`` searches one cell.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Generic, List, Mapping, Optional, Protocol, Sequence, Set, TypeVar, Union

from fsdp_matrix.bisect.outcome import Outcome

Env = TypeVar("Env")


@dataclass
class Prepared(Generic[Env]):
    """An Installer's answer for one candidate."""

    env: Optional[Env]
    """The prepared env, or None when the candidate cannot be installed or imported."""
    reason: str = ""
    """Why it was skipped (installer output, import error)."""

    @property
    def ok(self) -> bool:
        return self.env is not None


class Installer(Protocol[Env]):
    """Prepares an env in which ``candidate`` is installed; never raises for an install failure."""

    def prepare(self, candidate: str) -> Prepared[Env]: ...


class Untestable(Exception):
    """Raised by a Runner when the cell could not be run at all in the env (``git bisect skip``)."""


CellOutcome = Union[Outcome, Untestable]
"""What one cell did in one env, or why it could not run there."""


class CellsRunner(Protocol[Env]):
    """Runs several cells in a prepared env in one launch. A cell missing from the answer, or given as Untestable,
    could not run there; raising Untestable means none could."""

    def run_cells(self, env: Env, candidate: str, cells: Sequence[str]) -> Mapping[str, CellOutcome]: ...


@dataclass
class Step:
    """One tested candidate."""

    candidate: str
    """Release version (or date) tested."""
    installed: bool
    """False when it was skipped: it could not be installed or imported."""
    outcome: Optional[Outcome] = None
    """What the cell did (the first cell, in a search over several); None when skipped."""
    reason: str = ""
    """Why it was skipped."""
    seconds: float = 0.0
    """Wall time of install plus run."""
    outcomes: Dict[str, Outcome] = field(default_factory=dict)
    """Every cell run at this step, and what it did."""
    cells_skipped: Dict[str, str] = field(default_factory=dict)
    """Cells that could not run at this step, and why."""


def install_bound(n: int) -> int:
    """Most installs of non-skipped candidates a bisection over ``n`` candidates may take."""
    return math.ceil(math.log2(n)) + 2 if n > 1 else 1


@dataclass
class CellAnswer:
    """The answer of a search for one cell."""

    cell: str
    """The cell."""
    first_changed: Optional[str] = None
    """The first candidate whose outcome differs from the reference's; None when nothing changed or unknown."""
    last_unchanged: Optional[str] = None
    """The candidate just before it that was tested and behaves like the reference."""
    untestable: List[str] = field(default_factory=list)
    """Skipped candidates between last_unchanged and first_changed: the change may be in any of them instead."""
    reference: Optional[Outcome] = None
    """What the cell did at the oldest testable candidate."""
    changed_to: Optional[Outcome] = None
    """What it did at first_changed."""
    answer: str = ""
    """One line for people."""


@dataclass
class SearchResult:
    """The answer of one search over several cells, with the steps they shared."""

    package: str
    """What was bisected: a package name, or ``date``."""
    candidates: List[str]
    """Every candidate, oldest first."""
    cells: Dict[str, CellAnswer] = field(default_factory=dict)
    """Per cell, in the order given."""
    steps: List[Step] = field(default_factory=list)
    """Every candidate tested (installed or skipped) in the order tested; outcomes given as known are not steps."""

    @property
    def installs(self) -> int:
        return len(self.steps)


class _Search(Generic[Env]):
    def __init__(
        self,
        installer: Installer[Env],
        runner: CellsRunner[Env],
        candidates: Sequence[str],
        clock: Callable[[], float],
        on_step: Optional[Callable[[Step], None]],
        on_start: Optional[Callable[[str, Sequence[str]], None]],
        known: Mapping[int, Mapping[str, Outcome]],
    ) -> None:
        self.installer, self.runner, self.candidates, self.clock = installer, runner, list(candidates), clock
        self.on_step, self.on_start = on_step, on_start
        self.steps: List[Step] = []
        self.outcomes: Dict[int, Dict[str, Outcome]] = {i: dict(o) for i, o in known.items()}
        self.skipped: Dict[int, str] = {}
        self.cell_skipped: Dict[str, Set[int]] = {}
        self.envs: Dict[int, Prepared[Env]] = {}

    def outcome(self, index: int, cell: str) -> Optional[Outcome]:
        return self.outcomes.get(index, {}).get(cell)

    def usable(self, index: int, cell: str) -> bool:
        return index not in self.skipped and index not in self.cell_skipped.get(cell, set())

    def test(self, index: int, cells: Sequence[str]) -> None:
        """Run at candidate ``index`` the given cells that have no outcome there yet, all in one launch."""
        need = [c for c in cells if self.outcome(index, c) is None and self.usable(index, c)]
        if not need:
            return
        candidate = self.candidates[index]
        if self.on_start:
            self.on_start(candidate, need)
        start = self.clock()
        prepared = self.envs.get(index) or self.installer.prepare(candidate)
        self.envs[index] = prepared
        if not prepared.ok:
            self.skipped[index] = prepared.reason
            step = Step(candidate, False, reason=prepared.reason, seconds=self.clock() - start)
        else:
            try:
                answers: Mapping[str, CellOutcome] = self.runner.run_cells(prepared.env, candidate, need)
            except Untestable as exc:
                answers = {c: exc for c in need}
            got = {c: a for c, a in answers.items() if c in need and isinstance(a, Outcome)}
            missed = {c: str(answers.get(c) or "no outcome") for c in need if c not in got}
            for cell in missed:
                self.cell_skipped.setdefault(cell, set()).add(index)
            self.outcomes.setdefault(index, {}).update(got)
            first = got.get(need[0])
            reason = "" if got else "; ".join(dict.fromkeys(missed.values()))
            step = Step(candidate, bool(got), first, reason, self.clock() - start, got, missed)
        self.steps.append(step)
        if self.on_step:
            self.on_step(step)


def _same_default(a: Outcome, b: Outcome) -> bool:
    return a == b


def bisect_cells(
    installer: Installer[Env],
    runner: CellsRunner[Env],
    candidates: Sequence[str],
    cells: Sequence[str],
    package: str,
    *,
    known: Optional[Mapping[int, Mapping[str, Outcome]]] = None,
    same: Callable[[Outcome, Outcome], bool] = _same_default,
    clock: Callable[[], float] = time.monotonic,
    on_step: Optional[Callable[[Step], None]] = None,
    on_start: Optional[Callable[[str, Sequence[str]], None]] = None,
    tested: str = "tested",
) -> SearchResult:
    """For each cell, binary search ``candidates`` (oldest first) for the first whose outcome differs (per ``same``)
    from the oldest testable one's. ``known`` gives outcomes already observed, by candidate index (e.g. both ends
    from an upgrade's base and target runs): they cost no step.

    A step tests the median of the widest open interval, with every open cell whose interval holds it. A candidate
    that cannot be installed is skipped for all cells, a cell that cannot run at a candidate for that cell only.
    Assumes one change between the ends: when the outcome flips and flips back, it finds one of the changes.
    ``tested`` is the word the answers use for a candidate that gave an outcome (a one-cell release bisect says
    ``installed``, as its answers always have).
    """
    if not candidates:
        raise ValueError("no candidates to bisect")
    cands, cells = list(candidates), list(dict.fromkeys(cells))
    search = _Search(installer, runner, cands, clock, on_step, on_start, known or {})
    words = _Words("" if package == "date" else f"{package} ", tested)
    lo, hi = _test_ends(search, cells)
    notes = {c: _end_notes(cands, lo, hi, c, words) for c in cells}
    answers = {c: CellAnswer(c) for c in cells}
    open_cells = _compare_ends(search, cells, lo, hi, answers, same, words)
    _narrow(search, open_cells, lo, hi, answers, same)
    for cell in open_cells:
        _changed_answer(search, answers[cell], lo[cell], hi[cell], words)
    for cell in cells:
        if notes[cell] and not answers[cell].answer.startswith(("no candidate", "only ")):
            answers[cell].answer += f" [{'; '.join(notes[cell])}]"
    return SearchResult(package, cands, answers, search.steps)


@dataclass(frozen=True)
class _Words:
    """How the answers name things."""

    name: str
    """The package and a space (``peft ``), or nothing in a search over dates."""
    tested: str
    """The word for a candidate that gave an outcome."""


def _test_ends(search: _Search[Env], cells: List[str]) -> tuple[Dict[str, int], Dict[str, int]]:
    """Each cell's testable ends (lo, hi): an end that cannot be tested is replaced by its nearest testable
    neighbour."""
    lo: Dict[str, int] = {}
    hi: Dict[str, int] = {}
    n = len(search.candidates)
    for index in range(n):
        pending = [c for c in cells if c not in lo]
        if not pending:
            break
        search.test(index, pending)
        lo.update({c: index for c in pending if search.outcome(index, c) is not None})
    for index in range(n - 1, 0, -1):
        pending = [c for c in cells if c in lo and c not in hi and lo[c] < index]
        if not pending:
            break
        search.test(index, pending)
        hi.update({c: index for c in pending if search.outcome(index, c) is not None})
    return lo, hi


def _compare_ends(
    search: _Search[Env],
    cells: List[str],
    lo: Mapping[str, int],
    hi: Mapping[str, int],
    answers: Mapping[str, CellAnswer],
    same: Callable[[Outcome, Outcome], bool],
    words: _Words,
) -> List[str]:
    """Answer the cells whose ends settle it (untestable, one end only, no change); the others are open."""
    cands, name = search.candidates, words.name
    open_cells: List[str] = []
    for cell in cells:
        ans = answers[cell]
        if cell not in lo:
            ans.answer = f"no candidate between {name}{cands[0]} and {cands[-1]} could be {words.tested}"
            continue
        ans.reference = reference = search.outcome(lo[cell], cell)
        assert reference is not None
        if cell not in hi:
            ans.answer = (
                f"only {name}{cands[lo[cell]]} could be {words.tested}; nothing to compare: {reference.describe()}"
            )
        elif same(search.outcome(hi[cell], cell), reference):
            ans.answer = (
                f"no change: {name}{cands[lo[cell]]} and {cands[hi[cell]]} both give {reference.describe()} "
                "(a change that reverts in between is not seen)"
            )
        else:
            open_cells.append(cell)
    return open_cells


def _narrow(
    search: _Search[Env],
    open_cells: List[str],
    lo: Dict[str, int],
    hi: Dict[str, int],
    answers: Mapping[str, CellAnswer],
    same: Callable[[Outcome, Outcome], bool],
) -> None:
    """Halve the open cells' intervals until no testable candidate is left inside; invariant per open cell:
    outcome(lo) is like the reference, outcome(hi) is not."""

    def pool(cell: str) -> List[int]:
        return [i for i in range(lo[cell] + 1, hi[cell]) if search.usable(i, cell)]

    while True:
        pools = {c: pool(c) for c in open_cells}
        widest = max(open_cells, key=lambda c: len(pools[c]), default=None)
        if widest is None or not pools[widest]:
            return
        mid = pools[widest][len(pools[widest]) // 2]
        group = [c for c in open_cells if mid in pools[c]]
        search.test(mid, group)
        for cell in group:
            seen = search.outcome(mid, cell)
            if seen is None:
                continue
            if same(seen, answers[cell].reference):
                lo[cell] = mid
            else:
                hi[cell] = mid


def _changed_answer(search: _Search[Env], ans: CellAnswer, lo: int, hi: int, words: _Words) -> None:
    cands = search.candidates
    ans.first_changed, ans.last_unchanged = cands[hi], cands[lo]
    ans.untestable = [cands[i] for i in range(lo + 1, hi)]
    ans.changed_to = search.outcome(hi, ans.cell)
    assert ans.reference is not None and ans.changed_to is not None
    changed = f"{ans.reference.describe()} -> {ans.changed_to.describe()}"
    first = f"first changed: {words.name}{ans.first_changed}"
    if ans.untestable:
        first += f" or one of the untestable {', '.join(ans.untestable)}"
    ans.answer = f"{first} (last unchanged: {ans.last_unchanged}): {changed}"


def _end_notes(cands: List[str], lo: Mapping[str, int], hi: Mapping[str, int], cell: str, words: _Words) -> List[str]:
    """Which asked-for end could not be tested, and what stood in for it."""
    notes: List[str] = []
    if cell in lo and lo[cell] != 0:
        notes.append(f"{cands[0]} could not be {words.tested}; reference is {cands[lo[cell]]}")
    if cell in lo and cell in hi and hi[cell] != len(cands) - 1:
        notes.append(f"{cands[-1]} could not be {words.tested}; newest tested is {cands[hi[cell]]}")
    return notes
