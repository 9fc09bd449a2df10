"""Regexes from matrix.yaml (and the pastes triage searches with them), matched with a time bound.

A rule's regex is written by whoever files a case and is searched in error messages, rank stacks and pasted logs of
megabytes. Python's ``re`` cannot be interrupted (it holds the GIL), so one nested quantifier could hang a run or a
triage for good; the `regex <https://pypi.org/project/regex/>`_ module takes a ``timeout`` per search. A pattern is
also probed once, when the matrix is read, on texts that make a backtracking engine try every split, so that such a
rule is refused by ``validate`` rather than met during a run. (``regex`` already answers many patterns that hang
``re``, the nested ``(\\w+\\s?)+QQQ`` among them, in linear time; overlapping alternatives such as ``(a|aa)+$`` still
blow up, and are what the probes catch. The probes repeat a fixed alphabet and the pattern's own literal characters
and runs, so ``(b|bb)+$`` is caught too.) Probes cannot catch every such pattern, so many searches made for one
answer (a triage) share one time ``budget``: a pattern that timed out once is not searched again, and once the budget
is spent no pattern is; ``Budget.line`` says what was skipped.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional

import regex

error = regex.error
"""What an invalid pattern raises."""

TIMEOUT_S = 2.0
"""How long one search may take before it is given up as no match (a linear search of a 2 MB paste takes ms)."""
PROBE_S = 0.5
"""How long a pattern may take on one probe text when the matrix is read; past it the rule is refused."""
PROBE_CHARS = 1_000
"""Length of each probe: nested quantifiers blow up within a few dozen characters; a linear pattern reads 1,000 in
microseconds."""
_PROBE_UNITS = ("a", "1", " ", "a ", "a1", "a.", "a_", "-", ".", "/", "a\n", "x:", "\t")
"""What a probe repeats: word characters, digits, spaces and the separators tracebacks are made of; each pattern is
probed with its own literal characters and runs as well (``_own_units``)."""
_OWN_UNITS = 48
"""At most this many probes made of a pattern's own characters and literal runs."""
_META = set("()[]{}|*+?^$.\\")
BUDGET_S = 10.0
"""How long all the searches made under one ``budget`` (one triage) may take together (a triage of 40 tracebacks
searches for 0.03 s)."""
SLOW_S = PROBE_S
"""Under a budget, a pattern whose one search took longer than this is not searched again: a linear search of a
2 MB paste takes milliseconds, and a backtracking one takes longer with every character."""


@functools.lru_cache(maxsize=4096)
def _compile(pattern: str, flags: int = 0) -> regex.Pattern:
    """``pattern`` compiled (cached); ``error`` when it is not a regex."""
    return regex.compile(pattern, flags)


@dataclass
class Budget:
    """One time budget shared by the searches made under ``budget()``, and what it left out."""

    total_s: float
    """Seconds all searches may take together."""
    spent_s: float = 0.0
    """Seconds searched so far."""
    timed_out: Dict[str, str] = field(default_factory=dict)
    """pattern -> how long its search took, past ``SLOW_S`` (``2s on 41 characters``): not searched again."""
    skipped: Dict[str, int] = field(default_factory=dict)
    """pattern -> searches not made (it timed out before, or the budget was spent)."""

    @property
    def left_s(self) -> float:
        return self.total_s - self.spent_s

    def line(self) -> Optional[str]:
        """One line saying which regexes timed out and what was skipped; None when nothing was."""
        if not (self.timed_out or self.skipped):
            return None
        parts = []
        if self.timed_out:
            first, how = next(iter(self.timed_out.items()))
            many = len(self.timed_out) > 1
            which = f"{len(self.timed_out)} regexes (first {first[:80]!r})" if many else f"regex {first[:80]!r}"
            parts.append(f"{which} timed out (a search took {how}): not searched again")
        if self.left_s <= 0:
            parts.append(f"the {self.total_s:g}s budget for all regex searches ran out")
        kinds = len(self.skipped)
        skipped = f"{sum(self.skipped.values())} searches of {kinds} pattern{'s' if kinds != 1 else ''} skipped"
        return "; ".join(parts) + f" ({skipped}, taken as no match)"


_BUDGET: contextvars.ContextVar[Optional[Budget]] = contextvars.ContextVar("fsdp_matrix_regex_budget", default=None)


@contextlib.contextmanager
def budget(total_s: float = BUDGET_S) -> Iterator[Budget]:
    """Searches made inside share ``total_s`` seconds, and a pattern that times out once is not searched again."""
    spent = Budget(total_s)
    token = _BUDGET.set(spent)
    try:
        yield spent
    finally:
        _BUDGET.reset(token)


def _budgeted(spent: Budget, pattern: str, text: str, flags: int, timeout: float) -> Optional[regex.Match]:
    if pattern in spent.timed_out or spent.left_s <= 0:
        spent.skipped[pattern] = spent.skipped.get(pattern, 0) + 1
        return None
    start, bound = time.monotonic(), min(timeout, spent.left_s)
    found = None
    try:
        found = _compile(pattern, flags).search(text, timeout=bound)
    except TimeoutError:
        pass
    took = time.monotonic() - start
    spent.spent_s += took
    if took > SLOW_S:  # backtracking: a longer text, a search later, would take longer still
        spent.timed_out[pattern] = f"{took:.1f}s on {len(text):,} characters"
    return found


def search(pattern: str, text: str, flags: int = 0, timeout: Optional[float] = None) -> Optional[regex.Match]:
    """``pattern`` searched in ``text`` for at most ``timeout`` seconds (``TIMEOUT_S``); past it, None, and one line
    on stderr. Under ``budget()`` the line is left to ``Budget.line`` and the search to the budget's rules."""
    timeout = TIMEOUT_S if timeout is None else timeout
    spent = _BUDGET.get()
    if spent is not None:
        return _budgeted(spent, pattern, text, flags, timeout)
    try:
        return _compile(pattern, flags).search(text, timeout=timeout)
    except TimeoutError:
        print(
            f"fsdp-matrix: regex {pattern[:80]!r} timed out after {timeout:g}s on {len(text):,} characters: "
            "taken as no match",
            file=sys.stderr,
        )
        return None


class Bounded:
    """A compiled pattern whose ``search`` is bounded (see ``search``): a drop-in for ``re.Pattern.search``."""

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self.pattern = pattern
        """The source text of the pattern."""
        self.flags = flags
        """Its flags (``re``'s and ``regex``'s values agree for IGNORECASE, MULTILINE, DOTALL)."""
        _compile(pattern, flags)

    def search(self, text: str) -> Optional[regex.Match]:
        return search(self.pattern, text, self.flags)


def _own_units(pattern: str) -> tuple:
    """The pattern's literal characters, one by one, then its runs of literal characters (``xy`` of ``(xy|xyxy)+$``):
    texts that its own overlapping alternatives can split many ways."""
    chars: List[str] = []
    runs: List[str] = []
    run = ""
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":  # an escape: \d, \s (the fixed alphabet covers them) or an escaped literal
            ch = pattern[i + 1 : i + 2]
            i += 2
            if not ch or ch.isalnum():
                runs, run = runs + [run], ""
                continue
        else:
            i += 1
            if ch in _META:
                runs, run = runs + [run], ""
                continue
        run += ch
        chars += [ch] if ch not in chars else []
    units = [u for u in dict.fromkeys(chars + [r for r in runs + [run] if len(r) > 1]) if u not in _PROBE_UNITS]
    return tuple(units[:_OWN_UNITS])


@functools.lru_cache(maxsize=4096)
def check(pattern: str) -> Optional[str]:
    """Why ``pattern`` cannot be a rule's regex (invalid, or backtracking catastrophically on a probe), or None."""
    try:
        compiled = _compile(pattern)
    except error as exc:
        return f"invalid regex: {exc}"
    for unit in _PROBE_UNITS + _own_units(pattern):
        # the trailing control character makes every match attempt fail late, after the engine tried its splits
        text = unit * (PROBE_CHARS // len(unit)) + "\x00"
        try:
            compiled.search(text, timeout=PROBE_S)
        except TimeoutError:
            return (
                f"regex backtracks catastrophically (a search of {len(text):,} characters of {unit!r} ran past "
                f"{PROBE_S:g}s): avoid repeats whose parts overlap, such as (a|aa)+ or (\\w+\\s?)+"
            )
    return None
