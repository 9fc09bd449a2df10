"""What works on the user's versions, in one line each: a setting to change (the matched rule's own cells with one
setting changed that train there), or a release to move to (where the matched rule stops reproducing)."""

from __future__ import annotations

from typing import List, Mapping, Optional

from packaging.version import InvalidVersion, Version

from fsdp_matrix.triage.answer import RuleFit, Workaround


def _older(mine: Optional[str], fixed: str) -> bool:
    """The user's release is before the fixing one; True when the user's is unknown (the release is still worth
    naming)."""
    try:
        return mine is None or Version(mine) < Version(fixed.lstrip(">=<~! "))
    except InvalidVersion:
        return True


def with_settings(change: str, together: List[str]) -> str:
    """A change with the settings it needs beside it (``storage=bf16 with autocast=0``): one change alone that
    reaches a cell that does not train is not what works."""
    return f"{change} with {', '.join(together)}" if together else change


def what_works(
    offered: List[Workaround], label: str, fit: Optional[RuleFit], versions: Mapping[str, Optional[str]]
) -> List[str]:
    """Settings that train on ``label`` (the user's versions or the nearest combo), then releases that fix the
    matched rule and are newer than the user's."""
    out = [
        f"set {with_settings(w.change, w.together)} (trains on {label}: {w.rule}, {w.cells} cell(s))" for w in offered
    ]
    for package, release in (fit.fixed_versions if fit else {}).items():
        if _older(versions.get(package), release):
            mine = versions.get(package)
            out.append(
                f"upgrade {package} to {release.lstrip('>=')} or later" + (f" (you have {mine})" if mine else "")
            )
    return out
