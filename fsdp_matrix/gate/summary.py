"""The gate's answer for people (markdown, for ``$GITHUB_STEP_SUMMARY`` and the log) and for programs (JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from fsdp_matrix.gate.bisects import Named
from fsdp_matrix.gate.changes import KIND_TEXT, CellChange, Confirmation, NotJudged
from fsdp_matrix.gate.refs import Refs, short
from fsdp_matrix.gate.runs import Seen


@dataclass
class GateResult:
    """Everything the gate found, in the order its steps found it."""

    package: str
    """The package under test."""
    refs: Refs
    """Head, base and the commits between."""
    combos: List[str]
    """The combos gated."""
    cells: int
    """Cells run per commit and combo."""
    allow_missing: int = 0
    """Cells that may go without a result (``--allow-missing``) before the gate fails for them."""
    changes: List[CellChange] = field(default_factory=list)
    """Every cell whose outcome changed, before the confirm step."""
    confirmation: Confirmation = field(default_factory=Confirmation)
    """The changes that count, and the flaky ones."""
    named: List[Named] = field(default_factory=list)
    """The commit the bisect named for each confirmed change (empty on a one-commit pull request)."""
    problems: List[str] = field(default_factory=list)
    """Combos the gate could not judge (their base did not build): exit 2, unless another combo fails (exit 1)."""
    reused: List[str] = field(default_factory=list)
    """``combo@commit`` runs read back from the cache rather than run."""
    judged: int = 0
    """(combo, cell) pairs with a result at both ends, over every combo whose base could be run."""
    not_judged: List[NotJudged] = field(default_factory=list)
    """Cells with no result at the base or at the head: never "no change"."""
    silent: List[str] = field(default_factory=list)
    """Combos none of whose cells had a result: an alert whatever ``allow_missing`` says."""

    @property
    def missing_fails(self) -> bool:
        """Cells without a result fail the gate: more than ``allow_missing`` of them, or a whole combo silent."""
        return bool(self.silent) or len(self.not_judged) > self.allow_missing

    @property
    def failures(self) -> List[CellChange]:
        """Confirmed changes that fail the gate."""
        return [c for c in self.confirmation.confirmed if c.fails]

    @property
    def exit_code(self) -> int:
        """1 on a failing change in any combo judged (a combo that could not be judged beside it is listed, and
        hides nothing); else 2 when a combo could not be judged; else 1 on cells not judged; else 0."""
        if self.failures:
            return 1
        return 2 if self.problems else (1 if self.missing_fails else 0)


def _verdict(seen: Seen) -> str:
    return seen.describe()  # the verdict, then what the cell did: ``REGRESSION (ValueError: toy broke)``


def _commit_cell(named: Optional[Named]) -> str:
    if named is None:
        return "-"
    if named.commit is None:
        return named.answer or "-"
    pr = named.commit.pr
    pr_text = f" (#{pr})" if pr and f"(#{pr})" not in named.commit.subject else ""
    return f"**{named.commit.sha[:10]}** {named.commit.subject}{pr_text}"


def _table(result: GateResult, changes: List[CellChange]) -> List[str]:
    named = {(n.combo, n.cell): n for n in result.named}
    rows = ["| combo | cell | base | head | what | first changed commit |", "| --- | --- | --- | --- | --- | --- |"]
    for c in changes:
        what = ("**" + KIND_TEXT[c.kind] + "**") if c.fails else KIND_TEXT[c.kind]
        commit = _commit_cell(named.get((c.combo, c.cell)))
        cells = [f"`{c.combo}`", f"`{c.cell}`", _verdict(c.base), _verdict(c.head), what, commit]
        rows.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    return rows


def headline(result: GateResult) -> str:
    failing = len(result.failures)
    if failing:
        also = ("; and **cannot judge** " + "; ".join(result.problems)) if result.problems else ""
        return f"**FAILED**: {failing} change(s) fail the gate (a new failure, or a fix that stopped holding){also}"
    if result.problems:
        return "**cannot judge**: " + "; ".join(result.problems)
    if result.missing_fails:
        silent = f"; silent (no result at all): {', '.join(result.silent)}" if result.silent else ""
        return (
            f"**FAILED**: {len(result.not_judged)} cell(s) not judged (no result at the base or the head; "
            f"--allow-missing {result.allow_missing}){silent}"
        )
    return "**passed**: no new failure, no fix that stopped holding"


def _cells_line(result: GateResult) -> str:
    combos = ", ".join(f"`{c}`" for c in result.combos)
    each = f" ({result.cells} each)" if len(result.combos) > 1 else ""
    total = result.cells * len(result.combos)
    return (
        f"- {total} cells, {result.judged} judged, on {combos}{each}; "
        f"{len(result.changes)} changed, {len(result.confirmation.flaky)} flaky"
    )


def _missing_table(result: GateResult) -> List[str]:
    rows = ["| combo | cell | why |", "| --- | --- | --- |"]
    for n in result.not_judged:
        rows.append("| " + " | ".join(x.replace("|", "\\|") for x in (f"`{n.combo}`", f"`{n.cell}`", n.why)) + " |")
    return rows


def markdown(result: GateResult) -> str:
    r = result.refs
    out = [
        f"## fsdp-matrix gate: {result.package} {r.head[:10]} against {r.base[:10]}",
        "",
        headline(result),
        "",
        f"- head: {short(r, r.head)}" + (" (uncommitted changes left out)" if r.dirty else ""),
        f"- base: {short(r, r.base)}, the merge base with `{r.base_ref}`; {r.pr_commits} commit(s) between",
        _cells_line(result),
    ]
    if result.reused:
        out.append(f"- read back from the cache: {', '.join(result.reused)}")
    if result.confirmation.confirmed:
        out += ["", "### Changed cells", "", *_table(result, result.confirmation.confirmed)]
    if result.not_judged:
        allowed = f"; --allow-missing {result.allow_missing}" if result.allow_missing else ""
        out += ["", f"### Not judged (no result at the base or the head{allowed})", "", *_missing_table(result)]
    if result.confirmation.flaky:
        flaky = _table(result, result.confirmation.flaky)
        title = "### Flaky (the head did not repeat, or the base reruns give it too: no alert, not bisected)"
        out += ["", title, "", *flaky]
    if result.changes and r.pr_commits < 2:
        out += ["", f"One commit between base and head: {short(r, r.head)} is the change."]
    return "\n".join(out) + "\n"


def _change_json(c: CellChange, named: Optional[Named]) -> Dict[str, Any]:
    return {
        "combo": c.combo,
        "cell": c.cell,
        "kind": c.kind,
        "fails": c.fails,
        "base": _seen_json(c.base),
        "head": _seen_json(c.head),
        "commit": asdict(named.commit) if named and named.commit else None,
        "bisect": named.answer if named else None,
    }


def _seen_json(seen: Seen) -> Dict[str, Any]:
    return {"verdict": seen.verdict, "outcome": asdict(seen.outcome) if seen.outcome else None, "reason": seen.reason}


def to_json(result: GateResult) -> Dict[str, Any]:
    r = result.refs
    named = {(n.combo, n.cell): n for n in result.named}
    return {
        "package": result.package,
        "repo": str(r.repo),
        "head": r.head,
        "base": r.base,
        "base_ref": r.base_ref,
        "commits": r.line[1:],
        "combos": result.combos,
        "cells": result.cells,
        "judged": result.judged,
        "not_judged": [asdict(n) for n in result.not_judged],
        "allow_missing": result.allow_missing,
        "silent": result.silent,
        "exit_code": result.exit_code,
        "problems": result.problems,
        "changed": [_change_json(c, named.get((c.combo, c.cell))) for c in result.confirmation.confirmed],
        "flaky": [_change_json(c, None) for c in result.confirmation.flaky],
        "reruns": result.confirmation.reruns,
        "reused": result.reused,
    }
