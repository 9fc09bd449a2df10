"""The answer for one setup: each matched case, what its rules expect on the user's versions with the evidence for
it, and for each known failure what works (triage's workarounds and "fixed in", on the case's own cells)."""

from __future__ import annotations

import dataclasses
from typing import Any, List, Mapping, Optional

from fsdp_matrix.cells import expand_case
from fsdp_matrix.check.answer import CaseAnswer, CheckAnswer, Expectation, FileRead
from fsdp_matrix.check.match import FAILING, CaseMatch, RuleHit, applies, cell_matches, match
from fsdp_matrix.check.read import Reading
from fsdp_matrix.check.seen import Seen, evidence
from fsdp_matrix.check.setup import Setup
from fsdp_matrix.expectations import expected_for
from fsdp_matrix.match import any_when
from fsdp_matrix.matrix import Combo, Matrix
from fsdp_matrix.triage.answer import Workaround
from fsdp_matrix.triage.match import nearest_combo, rule_versions
from fsdp_matrix.triage.versions import fixed_in, observed_range, older_than_observed, workarounds

EXAMPLES = 3
"""Cell ids shown per rule and per workaround."""
STATUS_ORDER = ("applies", "may-apply", "not-run", "trains")


def _when(rule: Any) -> str:
    whens = any_when(getattr(rule, "when", None) or {})
    return " or ".join(", ".join(f"{k}={v}" for k, v in w.items()) for w in whens if w) or "every cell"


def near_cells(found: CaseMatch, setup: Setup, change: str, cells: List[str]) -> List[str]:
    """Of ``cells`` (a workaround's), those that are the user's setup with only ``change`` made: the nearest
    setting change, not a cell that also differs in another setting (another adapter, another dtype)."""
    axis, _, text = change.partition("=")
    by_id = {c.id: c for c in expand_case(found.case, setup.device)}
    varied = {a for c in by_id.values() for a, _ in c.params}
    value = next((v for c in cells if c in by_id for a, v in by_id[c].params if a == axis), text)
    changed = dataclasses.replace(setup, values={**setup.values, axis: [value]})
    return [c for c in cells if c in by_id and cell_matches(by_id[c], changed, varied, found.entry)]


def _what_works(matrix: Matrix, found: CaseMatch, hit: RuleHit, setup: Setup, versions, seen, near, outside):
    """(workarounds, note): triage's one-setting changes of the rule's cells that train, kept to the cells that
    are the user's setup with that one change, with their records."""
    if older_than_observed(outside):
        return [], "none offered: " + "; ".join(line for line in outside if "older than every combo" in line)
    out = []
    for w in workarounds(matrix, found.case, hit.index, versions, setup.device):
        rule = found.case.expect[w.rule]
        w.cells = near_cells(found, setup, w.change, w.cells)
        if not w.cells:
            continue
        level, line = evidence(seen, found.case.id, w.cells, versions, near)
        out.append(
            Workaround(
                change=w.change, rule=f"expect[{w.rule}]", when=_when(rule), cells=len(w.cells),
                examples=w.cells[:EXAMPLES], source=getattr(rule, "source", "") or "", together=w.together,
                observed=line if level != "rules" else None,
            )
        )  # fmt: skip
    note = None if out else "no change of one of the rule's settings is expected to train on these versions"
    return out, note


def _expectation(matrix: Matrix, found: CaseMatch, hit: RuleHit, setup: Setup, versions, seen, near, outside
                 ) -> Expectation:  # fmt: skip
    case, exp = found.case, hit.expected
    rule = case.expect[hit.index] if hit.index >= 0 else None
    ids = sorted(c.id for c in hit.cells)
    level, line = evidence(seen, case.id, ids, versions, near)
    failing = exp.kind in FAILING
    fixed = fixed_in(matrix, case, hit.index) if failing and rule is not None else None
    if fixed is not None:
        fixed.text += _excluded(case, rule, hit.cells, versions)
    works, note = _what_works(matrix, found, hit, setup, versions, seen, near, outside) if fixed else ([], None)
    return Expectation(
        rule=case.rule_id(hit.index) if rule is not None else f"platform/{exp.platform}",
        index=hit.index,
        when=_when(rule) if rule is not None else "platform skip",
        outcome=exp.describe(),
        kind=exp.kind,
        conditions=[f"{k} in {v}" for k, v in hit.conditions.items()],
        cells=len(ids),
        examples=ids[:EXAMPLES],
        reproduces=rule_versions(rule) if rule is not None else "",
        source=(getattr(rule, "source", None) if rule is not None else exp.reason) or "",
        evidence=level,
        evidence_line=line,
        fixed=fixed.text if fixed else None,
        fixed_versions=fixed.versions if fixed else {},
        workarounds=works,
        workarounds_note=note,
    )


def _excluded(case, rule: Any, cells, versions) -> str:
    """A release a rule's ``!=`` bound leaves out (``trl !=0.23.0``) on which the same cells are expected to train,
    though no later release fixes it."""
    out = []
    for package, specs in (getattr(rule, "versions", None) or {}).items():
        for spec in str(specs).split(","):
            release = spec.strip()[2:] if spec.strip().startswith("!=") else None
            there = {**versions, package: release}
            if release and all(expected_for(case, c, there).kind == "ok" for c in cells):
                out.append(f"{package} {release}")
    return f"; the same cells train on {', '.join(out)} (the rule leaves it out)" if out else ""


def _status(found: CaseMatch) -> str:
    if any(applies(found, h) for h in found.rules):
        return "applies"
    if found.failing:
        return "may-apply"
    return "not-run" if all(h.expected.kind == "skip" for h in found.rules) else "trains"


def case_answer(matrix: Matrix, found: CaseMatch, setup: Setup, versions, seen, near, outside) -> CaseAnswer:
    rules = sorted(found.rules, key=lambda h: (h.expected.kind not in FAILING, h.index < 0, h.index))
    return CaseAnswer(
        case=found.case.id,
        title=found.case.title,
        report=found.case.report,
        status=_status(found),
        needs=found.need,
        entry=found.entry,
        matching_cells=len(found.cells),
        expectations=[_expectation(matrix, found, h, setup, versions, seen, near, outside) for h in rules],
    )


def _unknown(setup: Setup, found: List[CaseMatch]) -> List[str]:
    axes = {axis for m in found for c in m.cells for axis, _ in c.params}
    return sorted(axes - set(setup.values) - {"entry"})


def build(
    matrix: Matrix,
    setup: Setup,
    readings: List[Reading],
    read_where: str,
    versions: Mapping[str, Optional[str]],
    versions_from: str,
    seen: Optional[List[Seen]] = None,
    records: Optional[str] = None,
) -> CheckAnswer:
    """The whole answer for one setup."""
    seen = seen or []
    near: Optional[Combo] = nearest_combo(matrix, versions)
    outside = observed_range(matrix, versions)
    found = [] if setup.out_of_scope else match(matrix, setup, versions)
    cases = [case_answer(matrix, m, setup, versions, seen, near, outside) for m in found]
    cases.sort(key=lambda c: STATUS_ORDER.index(c.status))
    machines = "machine" if setup.nodes == 1 else "machines"
    return CheckAnswer(
        versions={p: v for p, v in versions.items() if v},
        versions_from=versions_from,
        read=read_where,
        files=[FileRead(kind=r.kind, path=r.path, loader=r.loader, cls=r.cls, notes=r.notes) for r in readings],
        out_of_scope=setup.out_of_scope,
        axes={k: [str(v) for v in vs] for k, vs in setup.values.items()},
        axes_from=dict(setup.how),
        unknown_axes=_unknown(setup, found),
        entry=setup.entry,
        layout=f"{setup.world_size} processes on {setup.nodes} {machines}, {setup.device}",
        notes=setup.notes,
        not_covered=setup.uncovered,
        other_settings=setup.other,
        plumbing=setup.plumbing,
        outside_observed=outside,
        nearest_combo=near.id if near else None,
        cases=cases,
        records=records,
    )
