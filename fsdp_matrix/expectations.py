"""Expectations: which matrix.yaml rule applies to a cell in an env, and whether an observed error fits it."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Dict, Mapping, Optional

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from fsdp_matrix.cells import Cell, matches
from fsdp_matrix.matrix import Case, Rule


@dataclass(frozen=True)
class Expected:
    """The expected outcome of one cell in one env."""

    kind: str
    """``ok``, ``error``, ``skip``, or ``none`` when no rule matched (always a failure: matrix.yaml needs a rule)."""
    error_type: Optional[str] = None
    """Expected exception class name (kind ``error``)."""
    match: Optional[str] = None
    """Regex searched in the error message (kind ``error``)."""
    module: Optional[str] = None
    """Expected raising module prefix, if the rule gives one."""
    reason: Optional[str] = None
    """Why the cell is skipped (kind ``skip``)."""
    rule: Optional[int] = None
    """Index of the matching rule in the case's ``expect`` list."""
    source: Optional[str] = None
    """The rule's citation."""

    def describe(self) -> str:
        if self.kind == "ok":
            return "ok"
        if self.kind == "error":
            where = f" in {self.module}" if self.module else ""
            return f"{self.error_type}: /{self.match}/{where}"
        if self.kind == "skip":
            return f"skip ({self.reason})"
        return "no rule matches"

    def to_json(self) -> Dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Expected:
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})


def version_matches(spec: str, installed: Optional[str]) -> bool:
    if installed is None:
        return False
    try:
        # local labels such as +cpu or +cu121 do not change which release it is
        return SpecifierSet(spec).contains(Version(installed).public, prereleases=True)
    except InvalidVersion:
        return False


def rule_matches(rule: Rule, cell: Cell, versions: Mapping[str, Optional[str]]) -> bool:
    return matches(rule.when, cell.context()) and all(
        version_matches(spec, versions.get(pkg)) for pkg, spec in rule.versions.items()
    )


def expected_for(case: Case, cell: Cell, versions: Mapping[str, Optional[str]]) -> Expected:
    """The outcome the case's first matching rule gives this cell under these installed versions.

    Rules are tried in matrix.yaml order; a rule matches when every ``when`` key equals the cell's value (device and
    world size included) and every ``versions`` specifier contains the installed release. No match is kind ``none``.
    """
    for index, rule in enumerate(case.expect):
        if not rule_matches(rule, cell, versions):
            continue
        if rule.ok:
            return Expected("ok", rule=index, source=rule.source)
        if rule.skip is not None:
            return Expected("skip", reason=rule.skip, rule=index, source=rule.source)
        err = rule.error
        return Expected("error", err.type, err.match, err.module, rule=index, source=rule.source)
    return Expected("none")


def signature_matches(
    expected: Expected, error_type: Optional[str], message: Optional[str], location: Optional[str]
) -> bool:
    """Does an observed error fit the expected signature? Type by class name, regex searched, module by prefix."""
    if expected.kind != "error" or not error_type:
        return False
    if error_type != expected.error_type and error_type.rsplit(".", 1)[-1] != expected.error_type:
        return False
    if not re.search(expected.match or "", message or ""):
        return False
    if expected.module:
        mod = location or ""
        return mod == expected.module or mod.startswith(expected.module + ".")
    return True
