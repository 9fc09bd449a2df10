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
) -> str:
    """``text`` cut to at most ``lines`` lines and then ``chars`` characters, marked with … where something went.

    ``tail`` keeps the end instead of the start: a traceback's error and an installer's reason come last. ``flat``
    first folds all whitespace into single spaces, for a one-line summary.
    """
    out = text or ""
    if flat:
        out = " ".join(out.split())
    if lines is not None:
        rows = out.strip("\n").splitlines()
        if len(rows) > lines:
            out = "\n".join(rows[-lines:] if tail else rows[:lines])
    if chars is not None and len(out) > chars:
        keep = max(0, chars - len(MARK))
        out = MARK + out[len(out) - keep :] if tail else out[:keep] + MARK
    return out


def first_line(text: Optional[str], chars: Optional[int] = None) -> str:
    """The first non-empty line, clipped: what a one-line verdict shows of an error message."""
    for line in (text or "").splitlines():
        if line.strip():
            return clip(line.strip(), chars)
    return ""
