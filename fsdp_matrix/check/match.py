"""Which cells of which cases a setup is, and what the rules expect of them on the user's versions.

A cell matches when each axis it names takes one of the setup's values for that axis (an axis the setup does not
know matches any value, and the rule that needs one says so); an axis the case varies but the cell does not name
is taken at its default (``setup.DEFAULTS``), and an axis the case never names puts no condition on it. The entry is
matched at the nearest one the case runs (``setup.ENTRY_CHAIN``). A cell whose grid pins its own layout (4 ranks,
2 nodes) matches a setup on as many nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Set

from fsdp_matrix.cells import Cell, expand_case
from fsdp_matrix.check.needs import needs
from fsdp_matrix.check.setup import DEFAULTS, ENTRY_CHAIN, Setup
from fsdp_matrix.expectations import Expected, expected_for
from fsdp_matrix.match import any_when, same_value
from fsdp_matrix.matrix import Case, Matrix

FAILING = ("error", "hang")
"""Expected kinds that are a known failure (a silent one is a check that fails: kind ``error``)."""


@dataclass
class RuleHit:
    """One rule of a case that decides some of the matching cells."""

    index: int
    """Index in the case's ``expect`` (or -1 for a platform skip)."""
    expected: Expected
    """What it expects."""
    cells: List[Cell] = field(default_factory=list)
    """The matching cells it decides."""
    conditions: Dict[str, List[Any]] = field(default_factory=dict)
    """Unknown axes the rule's ``when`` names: it applies only when the setup has one of these values."""


@dataclass
class CaseMatch:
    """A case with cells the setup matches."""

    case: Case
    need: str
    """What the script must do for the case to apply ('' when the settings alone reach it)."""
    entry: str
    """The entry the case is matched at."""
    rules: List[RuleHit] = field(default_factory=list)
    """The rules deciding the matching cells, in ``expect`` order."""

    @property
    def failing(self) -> List[RuleHit]:
        return [r for r in self.rules if r.expected.kind in FAILING]

    @property
    def cells(self) -> List[Cell]:
        return [c for r in self.rules for c in r.cells]


def _entries(case: Case) -> Set[str]:
    return {dict(c.params).get("entry", "own") for c in expand_case(case)}


def case_entry(case: Case, entry: str) -> str:
    """The nearest entry of the user's chain the case runs."""
    have = _entries(case)
    return next((e for e in ENTRY_CHAIN.get(entry, [entry]) if e in have), entry)


def _layout_fits(cell: Cell, setup: Setup) -> bool:
    if (cell.world_size, cell.nodes) == (2, 1):
        return True
    return cell.nodes == setup.nodes and setup.world_size >= cell.world_size


def cell_matches(cell: Cell, setup: Setup, varied: Set[str], entry: str) -> bool:
    """Does the setup have this cell's settings? (Unknown axes match any value.)"""
    params = dict(cell.params)
    values = {**setup.values, "entry": [entry]}
    for axis in varied | set(params):
        if axis not in values:
            continue
        have = params.get(axis, DEFAULTS.get(axis))
        if axis not in params and axis not in DEFAULTS:
            continue
        if not any(same_value(have, v) for v in values[axis]):
            return False
    return _layout_fits(cell, setup)


CHOSEN = ("adapter", "dtype")
"""Axes a user chooses that a launcher config alone may not say (no adapter config; the model's load dtype): when
unknown, a rule that does not hold for every declared value (matrix.yaml ``axes:``) puts a condition on them even
where its ``when`` does not name them. A LoRA failure is not claimed for a config that may train without adapters,
nor a bf16 one for a model that may be loaded in fp32 (``--set dtype=`` makes it definite)."""


def _values(cells: List[Cell], axis: str) -> Set[str]:
    return {str(dict(c.params)[axis]) for c in cells if axis in dict(c.params)}


def _conditions(rule: Any, setup: Setup, decided: List[Cell], every_cell: List[Cell], declared: Mapping[str, List]
                ) -> Dict[str, List]:  # fmt: skip
    """Unknown axes the rule needs: those its ``when`` names, and a CHOSEN axis whose declared values (else the
    case's) the rule's cells over the whole case, on these versions, do not all take."""
    known = set(setup.values) | {"entry", "device", "world_size", "nodes"}
    out: Dict[str, List] = {}
    # a ``when`` may be a list of alternatives: one that names no unknown axis puts no condition
    for when in any_when(getattr(rule, "when", None) or {}):
        unknown = {k: (v if isinstance(v, list) else [v]) for k, v in when.items() if k not in known}
        if not unknown:
            out = {}
            break
        for k, v in unknown.items():
            out[k] = out.get(k, []) + [x for x in v if x not in out.get(k, [])]
    for axis in CHOSEN:
        values = _values(decided, axis)
        every = {str(v) for v in declared.get(axis, [])} or _values(every_cell, axis)
        if axis not in known and axis not in out and values and not every <= values:
            out[axis] = sorted(values)
    return out


def match_case(
    case: Case, setup: Setup, versions: Mapping[str, Optional[str]], declared: Optional[Mapping[str, List]] = None
) -> Optional[CaseMatch]:
    """The case's cells the setup matches, grouped by the rule that decides each; None when none matches or the
    PEFT config rules the case out. ``declared``: the matrix's axes and their values (matrix.yaml ``axes:``)."""
    need = needs(case.id, setup.facts)
    if need is None:
        return None
    cells = expand_case(case, setup.device)
    varied = {axis for c in cells for axis, _ in c.params}
    entry = case_entry(case, setup.entry)
    found = CaseMatch(case, need, entry)
    decides: Dict[Any, List[Cell]] = {}
    by_rule: Dict[Any, RuleHit] = {}
    for cell in cells:
        expected = expected_for(case, cell, versions)
        key = expected.rule if expected.rule is not None else f"platform:{expected.platform}"
        decides.setdefault(key, []).append(cell)
        if not cell_matches(cell, setup, varied, entry):
            continue
        if key not in by_rule:
            by_rule[key] = RuleHit(-1 if expected.rule is None else expected.rule, expected)
        by_rule[key].cells.append(cell)
    if not by_rule:
        return None
    for key, hit in by_rule.items():
        rule = case.expect[hit.index] if hit.index >= 0 else None
        hit.conditions = _conditions(rule, setup, decides[key], cells, declared or {})
    found.rules = sorted(by_rule.values(), key=lambda r: (r.index < 0, r.index))
    return found


def match(matrix: Matrix, setup: Setup, versions: Mapping[str, Optional[str]]) -> List[CaseMatch]:
    """Every case with cells the setup matches."""
    declared = {name: list(axis.values) for name, axis in (matrix.axes or {}).items()}
    return [m for m in (match_case(c, setup, versions, declared) for c in matrix.cases) if m is not None]


def applies(found: CaseMatch, hit: RuleHit) -> bool:
    """The failure applies from the settings alone: the case needs no action and the rule no unknown setting."""
    return hit.expected.kind in FAILING and not found.need and not hit.conditions
