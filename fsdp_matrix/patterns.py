"""Regexes from matrix.yaml (and the pastes triage searches with them), matched with a time bound.

A rule's regex is written by whoever files a case and is searched in error messages, rank stacks and pasted logs of
megabytes. Python's ``re`` cannot be interrupted (it holds the GIL), so one nested quantifier could hang a run or a
triage for good; the `regex <https://pypi.org/project/regex/>`_ module takes a ``timeout`` per search. A pattern is
also probed once, when the matrix is read, on texts that make a backtracking engine try every split, so that such a
rule is refused by ``validate`` rather than met during a run. (``regex`` already answers many patterns that hang
``re``, the nested ``(\\w+\\s?)+QQQ`` among them, in linear time; overlapping alternatives such as ``(a|aa)+$`` still
blow up, and are what the probes catch.)
"""

from __future__ import annotations

import functools
import sys
from typing import Optional

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
"""What a probe repeats: word characters, digits, spaces and the separators tracebacks are made of."""


@functools.lru_cache(maxsize=4096)
def _compile(pattern: str, flags: int = 0) -> regex.Pattern:
    """``pattern`` compiled (cached); ``error`` when it is not a regex."""
    return regex.compile(pattern, flags)


def search(pattern: str, text: str, flags: int = 0, timeout: float = TIMEOUT_S) -> Optional[regex.Match]:
    """``pattern`` searched in ``text`` for at most ``timeout`` seconds; past it, None, and one line on stderr."""
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


@functools.lru_cache(maxsize=4096)
def check(pattern: str) -> Optional[str]:
    """Why ``pattern`` cannot be a rule's regex (invalid, or backtracking catastrophically on a probe), or None."""
    try:
        compiled = _compile(pattern)
    except error as exc:
        return f"invalid regex: {exc}"
    for unit in _PROBE_UNITS:
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
