"""The installed versions of packages in this interpreter: the one reading of ``importlib.metadata`` for
``explain``, ``triage``, records (``envs.local_versions``) and export; and the ``installed`` combo, the caller's own
env as it is (``python -m fsdp_matrix run --env installed``, ``pytest --pyargs fsdp_matrix.suite``).

A package installed from something other than an index (``pip install -e <checkout>``, ``pip install
git+URL@REF``) says where it came from in its PEP 610 ``direct_url.json``, read here (``direct_url``); records
carry that source and its commit (fsdp_matrix/envs/direct.py) the way they carry a nox source pin's.
"""

from __future__ import annotations

import json
from importlib import metadata
from typing import Any, Dict, Iterable, List, Optional

INSTALLED = "installed"
"""The combo id of the caller's own env: records of ``run --env installed`` and of ``fsdp_matrix.suite`` are filed
under it, with what is installed as their versions."""


def installed_versions(names: Iterable[str]) -> Dict[str, Optional[str]]:
    """Each package of ``names``, in order, with its installed version (None where it is not installed)."""
    out: Dict[str, Optional[str]] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def direct_url(name: str) -> Optional[Dict[str, Any]]:
    """The PEP 610 ``direct_url.json`` of installed package ``name``: None for a release from an index (installers
    write none), a package that is not installed, or a file that does not parse."""
    try:
        text = metadata.distribution(name).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("url"), str) else None


def uncovered(lines: Iterable[tuple]) -> List[str]:
    """One line per ``(cell key, Expected)`` whose expectation no rule gave (kind ``none``): such a cell still runs,
    and its verdict is a failure (DIFFERENT-ERROR), never a pass; the line says so before it runs."""
    return [
        f"not covered: {key}: no rule of matrix.yaml matches it at the installed versions; it runs and fails"
        for key, expected in lines
        if expected.kind == "none"
    ]
