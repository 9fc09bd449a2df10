"""The one way the harness shortens text it shows: error messages in lines, tracebacks in reports, installer output."""

from __future__ import annotations

from typing import Optional

MARK = "…"


def clip(
    text: Optional[str],
    chars: Optional[int] = None,
    *,
    lines: Optional[int] = None,
    tail: bool = False,
    flat: bool = False,
    middle: bool = False,
) -> str:
    """``text`` cut to at most ``lines`` lines and then ``chars`` characters, marked with … where something went.

    ``tail`` keeps the end instead of the start: a traceback's error and an installer's reason come last. ``middle``
    keeps both ends and says how much went between them: what a record stores of a huge message or traceback (its
    start says what failed and where, its end how). ``flat`` first folds all whitespace into single spaces, for a
    one-line summary.
    """
    out = text or ""
    if flat:
        out = " ".join(out.split())
    if lines is not None:
        rows = out.strip("\n").splitlines()
        if len(rows) > lines:
            out = "\n".join(rows[-lines:] if tail else rows[:lines])
    if chars is not None and len(out) > chars and middle:
        # sized for the most that could go, so the real mark (no longer) keeps the result within ``chars``
        keep = max(0, chars - len(_left_out(len(out))))
        out = out[: (keep + 1) // 2] + _left_out(len(out) - keep) + out[len(out) - keep // 2 :]
    elif chars is not None and len(out) > chars:
        keep = max(0, chars - len(MARK))
        out = MARK + out[len(out) - keep :] if tail else out[:keep] + MARK
    return out


def _left_out(count: int) -> str:
    return f"{MARK}[{count:,} characters left out]{MARK}"


def first_line(text: Optional[str], chars: Optional[int] = None) -> str:
    """The first non-empty line, clipped: what a one-line verdict shows of an error message."""
    for line in (text or "").splitlines():
        if line.strip():
            return clip(line.strip(), chars)
    return ""
