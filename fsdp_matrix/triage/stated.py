"""The versions a paste states: issue templates' listings (``- PEFT version: 0.15.0``, ``- PyTorch version (GPU?):
2.5.1+cu124``), pip's (``peft==0.10.0``, ``peft  0.11.2.dev0``, ``transformers-4.40.1``), and prose (``torch 2.2.2``).

What works is answered on these versions when the user gives none with ``--versions``: the issue's own, not the
ones installed where triage runs (an issue bot runs it on a machine that has none of the user's).
"""

from __future__ import annotations

import re
from typing import Dict, Iterable

from packaging.version import InvalidVersion, Version

ALIASES = {
    "torch": r"torch|pytorch",
    "peft": r"peft",
    "transformers": r"transformers",
    "accelerate": r"accelerate",
    "bitsandbytes": r"bitsandbytes|bnb",
    "trl": r"trl",
}
"""How each package is named in a listing (PyTorch's templates say ``PyTorch version``)."""
_VERSION = r"v?(\d+\.\d+(?:\.\d+)?(?:\.?(?:dev|post|rc|a|b)\d*)?)"


def _pattern(alias: str) -> re.Pattern[str]:
    # the name (in backticks or not), an optional "version" and "(GPU?)", then ==, :, =, - or spaces, then a version;
    # never a path or a module (torch/..., torch.distributed), never a range (>=)
    return re.compile(
        rf"(?<![\w./-])`?(?:{alias})`?(?:\s+version)?(?:\s*\([^)\n]*\))?\s*(?:==|:|=|-|\s)\s*{_VERSION}(?![\w.])",
        re.IGNORECASE,
    )


_PATTERNS = {package: _pattern(alias) for package, alias in ALIASES.items()}


def stated_versions(text: str, packages: Iterable[str] = tuple(ALIASES)) -> Dict[str, str]:
    """Package -> the first version the paste states for it (a valid PEP 440 release); packages it names no
    version of are left out."""
    out: Dict[str, str] = {}
    for package in packages:
        pattern = _PATTERNS.get(package)
        for found in pattern.finditer(text) if pattern else ():
            try:
                Version(found.group(1))
            except InvalidVersion:
                continue
            out[package] = found.group(1)
            break
    return out
