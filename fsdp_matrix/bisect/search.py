"""Bisection: find the first candidate (release or date) whose observed outcome differs from the old one's.

The search knows nothing about packages or processes. It talks to two collaborators given as Protocols (the way
pytest-xdist types its scheduler): an Installer prepares an env for a candidate or says why it cannot (the
``git bisect skip`` / exit 125 case), and a Runner runs the cell in that env and returns the observed Outcome.
Both directions work: "first changed" is the first candidate whose outcome differs from OLD's, whether that is
a bug appearing or a fix landing.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Generic, List, Optional, Protocol, Sequence, TypeVar

from fsdp_matrix.clip import clip

Env = TypeVar("Env")

_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]+\b")
# absolute paths differ per step (every step has its own venv): keep what follows site-packages, else the name
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[/\\][\w.+@~-]+){2,}")
# standalone numbers only (shapes, ports, pids, versions, ranks); digits inside names such as bfloat16 stay
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)*(?![\w])")
_SPACE = re.compile(r"\s+")
MESSAGE_LIMIT = 300


def _short_path(match: re.Match[str]) -> str:
    path = match.group(0).replace("\\", "/")
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1]
    return "<path>/" + path.rsplit("/", 1)[-1]


def normalise_message(message: Optional[str]) -> str:
    """The parts of an error message that identify the failure, without what varies from run to run."""
    if not message:
        return ""
    text = _ADDRESS.sub("0x?", message)
    text = _PATH.sub(_short_path, text)
    text = _NUMBER.sub("N", text)
    text = _SPACE.sub(" ", text).strip()
    return clip(text, MESSAGE_LIMIT)


@dataclass(frozen=True)
class Outcome:
    """What a cell did in one env, reduced to a comparable signature."""

    status: str
    """``ok``, ``error``, ``hang`` or ``crash``."""
    error_type: Optional[str] = None
    """Exception class name when status is ``error``."""
    message: str = ""
    """The normalised error message (see normalise_message); compared, so it must not hold run-to-run noise."""

    @classmethod
    def observed(cls, status: str, error_type: Optional[str] = None, message: Optional[str] = None) -> Outcome:
        if status != "error":
            return cls(status)
        return cls(status, error_type, normalise_message(message))

    def describe(self) -> str:
        if self.status != "error":
            return self.status
        text = f"{self.error_type}: {self.message}" if self.message else str(self.error_type)
        return clip(text, 100)


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


class Runner(Protocol[Env]):
    """Runs the cell under test in a prepared env and reports what it observed; raises Untestable if it cannot."""

    def run(self, env: Env, candidate: str) -> Outcome: ...


@dataclass
class Step:
    """One tested candidate."""

    candidate: str
    """Release version (or date) tested."""
    installed: bool
    """False when it was skipped: it could not be installed or imported."""
    outcome: Optional[Outcome] = None
    """What the cell did; None when skipped."""
    reason: str = ""
    """Why it was skipped."""
    seconds: float = 0.0
    """Wall time of install plus run."""


@dataclass
class BisectResult:
    """The answer of one bisection."""

    package: str
    """What was bisected: a package name, or ``date``."""
    old: str
    """The oldest candidate asked for."""
    new: str
    """The newest candidate asked for."""
    candidates: List[str]
    """Every candidate between old and new, inclusive, oldest first."""
    first_changed: Optional[str] = None
    """The first candidate whose outcome differs from the reference's; None when nothing changed or unknown."""
    last_unchanged: Optional[str] = None
    """The candidate just before it that was tested and behaves like the reference."""
    untestable: List[str] = field(default_factory=list)
    """Skipped candidates between last_unchanged and first_changed: the change may be in any of them instead."""
    steps: List[Step] = field(default_factory=list)
    """Every tested candidate, in the order tested."""
    answer: str = ""
    """One line for people: ``first changed: peft 0.14.0 (last unchanged: 0.13.2)``."""

    @property
    def installs(self) -> int:
        """Install attempts, skipped ones included."""
        return len(self.steps)

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        data["installs"] = self.installs
        return data


def install_bound(n: int) -> int:
    """Most installs of non-skipped candidates a bisection over ``n`` candidates may take."""
    return math.ceil(math.log2(n)) + 2 if n > 1 else 1


class _Search(Generic[Env]):
    def __init__(
        self,
        installer: Installer[Env],
        runner: Runner[Env],
        candidates: Sequence[str],
        clock: Callable[[], float],
        on_step: Optional[Callable[[Step], None]],
    ) -> None:
        self.installer, self.runner, self.candidates, self.clock = installer, runner, list(candidates), clock
        self.on_step = on_step
        self.steps: List[Step] = []
        self.outcomes: Dict[int, Outcome] = {}
        self.skipped: Dict[int, str] = {}

    def test(self, index: int) -> Optional[Outcome]:
        outcome = self._test(index)
        if self.on_step:
            self.on_step(self.steps[-1])
        return outcome

    def _test(self, index: int) -> Optional[Outcome]:
        candidate = self.candidates[index]
        start = self.clock()
        prepared = self.installer.prepare(candidate)
        if not prepared.ok:
            self.skipped[index] = prepared.reason
            self.steps.append(Step(candidate, False, reason=prepared.reason, seconds=self.clock() - start))
            return None
        try:
            outcome = self.runner.run(prepared.env, candidate)
        except Untestable as exc:
            self.skipped[index] = str(exc)
            self.steps.append(Step(candidate, False, reason=str(exc), seconds=self.clock() - start))
            return None
        self.outcomes[index] = outcome
        self.steps.append(Step(candidate, True, outcome, seconds=self.clock() - start))
        return outcome

    def first_testable(self, indices: Sequence[int]) -> Optional[int]:
        for index in indices:
            if self.test(index) is not None:
                return index
        return None


def bisect(
    installer: Installer[Env],
    runner: Runner[Env],
    candidates: Sequence[str],
    package: str,
    clock: Callable[[], float] = time.monotonic,
    on_step: Optional[Callable[[Step], None]] = None,
) -> BisectResult:
    """Binary search over ``candidates`` (oldest first) for the first whose outcome differs from the oldest one's.

    Assumes one change between the ends: when the outcome flips and flips back, it finds one of the changes. A
    candidate that cannot be installed is skipped and the median of the still-untested candidates is tried instead,
    so installs stay within ``install_bound(n)`` plus the skips. ``on_step`` sees each step as it ends.
    """
    if not candidates:
        raise ValueError("no candidates to bisect")
    cands = list(candidates)
    result = BisectResult(package, cands[0], cands[-1], cands)
    search = _Search(installer, runner, cands, clock, on_step)
    result.steps = search.steps
    n = len(cands)
    name = "" if package == "date" else f"{package} "

    # the ends must be testable; an uninstallable end is replaced by its nearest installable neighbour
    lo = search.first_testable(range(n))
    if lo is None:
        result.answer = f"no candidate between {name}{cands[0]} and {cands[-1]} could be installed"
        return result
    notes = []
    if lo != 0:
        notes.append(f"{cands[0]} could not be installed; reference is {cands[lo]}")
    reference = search.outcomes[lo]
    if lo == n - 1:
        result.answer = f"only {name}{cands[lo]} could be installed; nothing to compare: {reference.describe()}"
        return result
    hi = search.first_testable(range(n - 1, lo, -1))
    if hi is None:
        result.answer = f"only {name}{cands[lo]} could be installed; nothing to compare: {reference.describe()}"
        return result
    if hi != n - 1:
        notes.append(f"{cands[-1]} could not be installed; newest tested is {cands[hi]}")
    suffix = f" [{'; '.join(notes)}]" if notes else ""

    if search.outcomes[hi] == reference:
        result.answer = (
            f"no change: {name}{cands[lo]} and {cands[hi]} both give {reference.describe()} "
            f"(a change that reverts in between is not seen){suffix}"
        )
        return result

    # invariant: outcome(lo) == reference != outcome(hi)
    while True:
        pool = [i for i in range(lo + 1, hi) if i not in search.skipped]
        if not pool:
            break
        mid = pool[len(pool) // 2]
        outcome = search.test(mid)
        if outcome is None:
            continue
        if outcome == reference:
            lo = mid
        else:
            hi = mid
    result.first_changed, result.last_unchanged = cands[hi], cands[lo]
    result.untestable = [cands[i] for i in range(lo + 1, hi)]
    changed = f"{reference.describe()} -> {search.outcomes[hi].describe()}"
    if result.untestable:
        result.answer = (
            f"first changed: {name}{cands[hi]} or one of the untestable {', '.join(result.untestable)} "
            f"(last unchanged: {cands[lo]}): {changed}{suffix}"
        )
    else:
        result.answer = f"first changed: {name}{cands[hi]} (last unchanged: {cands[lo]}): {changed}{suffix}"
    return result
