"""The installed versions of packages in this interpreter: the one reading of ``importlib.metadata`` for
``explain``, ``triage``, records (``envs.local_versions``) and export."""

from __future__ import annotations

from importlib import metadata
from typing import Dict, Iterable, Optional


def installed_versions(names: Iterable[str]) -> Dict[str, Optional[str]]:
    """Each package of ``names``, in order, with its installed version (None where it is not installed)."""
    out: Dict[str, Optional[str]] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
