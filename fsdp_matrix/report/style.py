"""How each verdict looks in every report: one table keyed by verdict (plus ``missing``), nothing else decides it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from fsdp_matrix.verdicts import Verdict

MISSING = "missing"
"""Code of a grid entry with no record."""


@dataclass(frozen=True)
class Style:
    """What one verdict looks like."""

    symbol: str
    """Grid symbol; "!" marks exactly the verdicts that need attention, so a scan for "!" finds every problem."""
    severity: Optional[int]
    """Position in the needs-attention list (0 first: most likely a broken fix); None when it needs none."""
    background: str
    """HTML background colour."""
    color: str
    """HTML text colour."""
    label: str = ""
    """Legend text when it differs from the code."""


STYLES: Dict[str, Style] = {
    Verdict.REPRODUCED.value: Style("R", None, "#d6e4ff", "#1d3a7a"),
    Verdict.FIX_HOLDS.value: Style("F", None, "#cdeccd", "#1b5e20"),
    Verdict.SKIPPED.value: Style("-", None, "#eeeeee", "#757575"),
    MISSING: Style(".", None, "#ffffff", "#bdbdbd", "no record"),
    Verdict.REGRESSION.value: Style("!R", 0, "#d32f2f", "#ffffff"),
    Verdict.UNEXPECTED_FIX.value: Style("!U", 2, "#ffb300", "#3e2700"),
    Verdict.DIFFERENT_ERROR.value: Style("!D", 1, "#8e24aa", "#ffffff"),
    Verdict.HANG.value: Style("!H", 4, "#ef6c00", "#ffffff"),
    Verdict.CRASH.value: Style("!C", 3, "#5d4037", "#ffffff"),
    Verdict.ENV_ERROR.value: Style("!E", 5, "#455a64", "#ffffff"),
}
UNKNOWN = Style("!?", -1, "#000000", "#ffff00")
"""A verdict this version does not know (a newer record schema): shown, and first in line for attention."""

CODES: Tuple[str, ...] = tuple(STYLES)
"""Display order of verdicts (plus missing) in legends and counts."""


def style(code: str) -> Style:
    return STYLES.get(code, UNKNOWN)


def symbol(code: str) -> str:
    return style(code).symbol


def needs_attention(code: str) -> bool:
    return style(code).severity is not None


def severity(code: str) -> int:
    level = style(code).severity
    return len(STYLES) if level is None else level


def legend() -> str:
    ok = "  ".join(f"{symbol(c)} {STYLES[c].label or c}" for c in CODES if not needs_attention(c))
    bad = "  ".join(f"{symbol(c)} {c}" for c in CODES if needs_attention(c))
    return f"Legend: {ok}  |  needs attention: {bad}"
