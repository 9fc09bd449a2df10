"""Matching a cell and an env against a rule, in one place: ``when`` (a mapping, or a list of mappings of which any
may match), ``versions`` (PEP 440 specifiers on the installed releases), ``absent`` (optional packages the env must
lack) and a requirement's ``device``/``min_world_size``.

A cell is seen through its context (``Cell.context()``: its params plus ``device``, ``world_size`` and ``nodes``);
a rule through its ``when``, ``versions`` and ``absent``. Each test has a yes/no answer (``matches``, ``hits``) and
the same test in words (``which_mismatch``, ``why``), so that ``explain`` says exactly what decided.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

Versions = Mapping[str, Optional[str]]
"""Package -> installed version (None: not installed)."""


def same_value(value: Any, want: Any) -> bool:
    """Axis values compare as written, except that YAML writes orig as 0/1 or false/true: those are alike."""
    if isinstance(value, bool) or isinstance(want, bool):
        return isinstance(value, (bool, int)) and isinstance(want, (bool, int)) and bool(value) == bool(want)
    return value == want


def any_when(value: Any) -> List[Dict[str, Any]]:
    """The mappings of a ``when`` that may be one mapping or a list of them."""
    return list(value) if isinstance(value, list) else [value]


def matches(when: Mapping[str, Any], context: Mapping[str, Any]) -> bool:
    """True when every key of ``when`` is in ``context`` with the given value (a list means any of them)."""
    for key, want in when.items():
        if key not in context:
            return False
        options = want if isinstance(want, list) else [want]
        if not any(same_value(context[key], o) for o in options):
            return False
    return True


def which_mismatch(when: Mapping[str, Any], context: Mapping[str, Any]) -> Optional[str]:
    """Why ``when`` does not match ``context`` (``wrap: fsdp2 != decoder_layer``), or None when it matches."""
    for key, want in when.items():
        if key not in context:
            return f"{key}: this cell has no {key} axis"
        options = want if isinstance(want, list) else [want]
        if not any(same_value(context[key], o) for o in options):
            return (
                f"{key}: {context[key]!r} not in {options!r}"
                if isinstance(want, list)
                else f"{key}: {context[key]!r} != {want!r}"
            )
    return None


@functools.lru_cache(maxsize=4096)
def version_matches(spec: str, installed: Optional[str]) -> bool:
    if installed is None:
        return False
    try:
        # local labels such as +cpu or +cu121 do not change which release it is
        return SpecifierSet(spec).contains(Version(installed).public, prereleases=True)
    except InvalidVersion:
        return False


def version_mismatch(specs: Mapping[str, str], versions: Versions) -> Optional[str]:
    """The first ``versions`` specifier the env fails (``torch 2.13.0 not <2.7``), or None."""
    for pkg, spec in specs.items():
        if not version_matches(spec, versions.get(pkg)):
            return f"{pkg} {versions.get(pkg) or '(not installed)'} not {spec}"
    return None


def present(absent: Sequence[str], versions: Versions) -> List[str]:
    """The packages of ``absent`` that the env has after all (``trl 0.12.0 is installed``)."""
    return [f"{p} {versions[p]} is installed" for p in absent if versions.get(p)]


def hits(rule: Any, context: Mapping[str, Any], versions: Versions) -> bool:
    """Does ``rule`` (its ``when``, ``versions`` and ``absent``) hold for this cell and env? ``why``'s verdict."""
    return (
        any(matches(w, context) for w in any_when(rule.when))
        and version_mismatch(rule.versions, versions) is None
        and not any(versions.get(p) for p in rule.absent)
    )


def why(rule: Any, context: Mapping[str, Any], versions: Versions) -> Tuple[bool, str]:
    """``hits`` with its reason: the ``when`` key, version specifier or installed package that failed, in that order,
    or ``matches`` with the versions it read."""
    whens = any_when(rule.when)
    misses = [which_mismatch(w, context) for w in whens]
    if all(misses):
        return False, "when " + (
            misses[0] if len(misses) == 1 else "; ".join(f"[{i}] {m}" for i, m in enumerate(misses))
        )
    off = version_mismatch(rule.versions, versions)
    if off:
        return False, f"versions: {off}"
    there = present(rule.absent, versions)
    if there:
        return False, "absent: " + ", ".join(there)
    said = [f"{k} {versions.get(k)} {v}" for k, v in rule.versions.items()]
    return True, "matches" + (f" ({', '.join(said)})" if said else "")


def unmet(rule: Any, context: Mapping[str, Any]) -> Optional[str]:
    """The reason a requirement (a rule of a case's ``requires``) is unmet by this cell, or None: its ``when`` holds,
    and the cell's device or world size is short of what it needs."""
    if not any(matches(w, context) for w in any_when(rule.when)):
        return None
    if rule.device and context["device"] != rule.device:
        return f"needs {rule.device}, this run is on {context['device']}: {rule.reason}"
    if rule.min_world_size and context["world_size"] < rule.min_world_size:
        return f"needs world size >= {rule.min_world_size}, this run has {context['world_size']}: {rule.reason}"
    return None
