"""Diff of two reports (e.g. last night's and tonight's): which cells changed verdict, and is any a new REGRESSION.

An entry is (combo column, case/cell). The alerts, which make the exit code 1: a cell that is REGRESSION in NEW and
was not in OLD (another verdict, or no record at all: a new combo or cell), and a cell that passed in OLD (reproduced
or fix-holds) and now needs attention (crash, hang, env-error, DIFFERENT-ERROR): a fix that used to hold and now
segfaults is as much a broken night as a REGRESSION. A line of NEW that is not a record is an alert too (its verdict
is unknown), and so are vanished records: a combo of OLD with no record in NEW (a combo missing, an empty results file,
a report with no entries), or one that lost more than MAX_DROP of its records, and a recorded verdict that became
``skipped`` (a requirement or platform signature that started to match hides the cell, whatever it would say now).
An UNEXPECTED-FIX is listed on its own, without an alert: it means upstream fixed something, and matrix.yaml wants
updating.

The nightly reruns each flipped cell before it counts (fsdp_matrix/confirm.py): ``with_confirmation`` moves a flip
its reruns did not repeat out of its group into ``flaky``, where it raises no alert. A record the previous night
marked flaky is compared by the verdict its reruns settled on, not by the one-off verdict it recorded.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from fsdp_matrix.confirm import FLAKY
from fsdp_matrix.errors import MatrixError
from fsdp_matrix.records import RECORDS_FILE
from fsdp_matrix.report.grid import load_grid
from fsdp_matrix.report.json import REPORT_SCHEMA, to_json
from fsdp_matrix.report.style import symbol
from fsdp_matrix.report.text import one_line
from fsdp_matrix.usage import OneLineParser, flat
from fsdp_matrix.verdicts import Verdict

Key = Tuple[str, str]
"""(column id, case/cell)."""
MAX_DROP = 0.25
"""The share of a combo's records that may vanish between OLD and NEW without an alert: a cell or two taken out of
matrix.yaml is a listed removal; a combo that lost more than this (or all, or a run that died) is a lost night."""


class ReportInputError(Exception):
    """OLD or NEW cannot be read as a report."""


@dataclass(frozen=True)
class Change:
    """One entry whose verdict differs between OLD and NEW."""

    column: str
    """Combo column id."""
    cell: str
    """``case/cell``."""
    old: Optional[str]
    """Verdict in OLD; None when OLD has no record of it."""
    new: Optional[str]
    """Verdict in NEW; None when NEW has no record of it."""
    line: str = ""
    """NEW's ``expected … / observed …`` line (OLD's when the cell was removed)."""
    confirmation: Optional[str] = None
    """What its reruns said (confirm.py: confirmed, flaky, not-the-sources, unconfirmed); None: not rerun."""


@dataclass
class ReportDiff:
    """Changes grouped the way a nightly reader triages them; each change is in exactly one group."""

    regressions: List[Change] = field(default_factory=list)
    """REGRESSION in NEW and not in OLD (including entries new in NEW)."""
    broken: List[Change] = field(default_factory=list)
    """Passed in OLD (reproduced or fix-holds); crash, hang, env-error or DIFFERENT-ERROR in NEW."""
    unexpected_fixes: List[Change] = field(default_factory=list)
    """UNEXPECTED-FIX in NEW and not in OLD: upstream changed, update matrix.yaml."""
    skipped: List[Change] = field(default_factory=list)
    """Another verdict in OLD, ``skipped`` in NEW: the cell is no longer judged (an alert)."""
    changed: List[Change] = field(default_factory=list)
    """Every other verdict change between two recorded entries."""
    added: List[Change] = field(default_factory=list)
    """Entries only NEW has (not counted above)."""
    removed: List[Change] = field(default_factory=list)
    """Entries only OLD has."""
    flaky: List[Change] = field(default_factory=list)
    """Flips whose reruns did not repeat them (``with_confirmation``): listed apart, no alert, nothing bisected."""
    versions: List[str] = field(default_factory=list)
    """Columns whose recorded versions changed, e.g. a nightly combo whose pins moved."""
    lost: List[str] = field(default_factory=list)
    """Columns of OLD whose records vanished in NEW: all of them (a combo missing, an empty results file, a report
    with no entries) or more than ``MAX_DROP`` of them."""
    unreadable: List[str] = field(default_factory=list)
    """``file:line: reason`` of each line of NEW's cells.jsonl that is not a record (quarantined): its verdict, a
    REGRESSION maybe, is unknown."""

    @property
    def empty(self) -> bool:
        return not (
            self.regressions
            or self.broken
            or self.unexpected_fixes
            or self.skipped
            or self.changed
            or self.added
            or self.removed
            or self.flaky
        )

    @property
    def alerts(self) -> List[str]:
        """What fails a nightly, one line each: new regressions, passing cells that now need attention, and lines of
        NEW that are not records, records lost beyond ``MAX_DROP``, and cells now skipped."""
        return [_fmt(c) for c in self.regressions + self.broken + self.skipped] + self.lost + self.unreadable


def load_report(path: Path) -> Dict[str, Any]:
    """A report.json, or a results dir / cells.jsonl turned into the same JSON (a dir's report.json if no records)."""
    path = Path(path)
    try:
        if path.is_dir():
            if any(path.rglob(RECORDS_FILE)):
                return _records_report(path)
            if (path / "report.json").is_file():
                path = path / "report.json"
            else:
                raise ReportInputError(f"{path}: neither a {RECORDS_FILE} under it nor a report.json in it")
        elif path.name.endswith(".jsonl"):
            return _records_report(path)
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, MatrixError) as exc:
        raise ReportInputError(f"{path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict) or data.get("schema") != REPORT_SCHEMA:
        raise ReportInputError(f"{path}: not a fsdp-matrix report.json (schema {REPORT_SCHEMA})")
    return data


def _records_report(path: Path) -> Dict[str, Any]:
    """The report of a results dir or cells.jsonl; lines that are not records are named on stderr, and a file with
    no record at all is unreadable input (a diff against it would call every cell removed)."""
    grid = load_grid(path)
    if grid.skipped and not grid.rows:
        raise ReportInputError(f"{path}: no cell records; {grid.skipped_text()}, e.g. {one_line(str(grid.skipped[0]))}")
    for skip in grid.skipped:
        print(f"diff: {one_line(str(skip))}", file=sys.stderr)
    return to_json(grid)


def _entries(report: Dict[str, Any]) -> Dict[Key, Dict[str, Any]]:
    return {(col, cell): summary for col, cells in report["entries"].items() for cell, summary in cells.items()}


def _settled(summary: Optional[Dict[str, Any]]) -> Optional[str]:
    """An entry's verdict; for one its reruns called flaky, the verdict its last rerun gave."""
    if not summary:
        return None
    confirmation = summary.get("confirmation") or {}
    reruns = [v for v in confirmation.get("reruns") or [] if v]
    return reruns[-1] if confirmation.get("status") == FLAKY and reruns else summary.get("verdict")


def with_confirmation(diff: ReportDiff, statuses: Dict[Key, str]) -> ReportDiff:
    """``diff`` with each flip marked by its reruns' status, and the flaky ones moved into ``flaky``."""
    out = ReportDiff(
        added=diff.added, removed=diff.removed, versions=diff.versions, lost=diff.lost, unreadable=diff.unreadable
    )
    for name in ("regressions", "broken", "unexpected_fixes", "skipped", "changed"):
        for change in getattr(diff, name):
            marked = replace(change, confirmation=statuses.get((change.column, change.cell)))
            (out.flaky if marked.confirmation == FLAKY else getattr(out, name)).append(marked)
    return out


def _versions(report: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    return {c["id"]: c.get("versions") or {} for c in report.get("columns", [])}


def _passed(verdict: Optional[str]) -> Optional[bool]:
    """Whether a verdict passed; None for no record or a verdict this version does not know."""
    try:
        return Verdict(verdict).passed if verdict is not None else None
    except ValueError:
        return None


def _lost(before: Dict[Key, Any], after: Dict[Key, Any], max_drop: float) -> List[str]:
    """``column: ...`` for each column of ``before`` that lost every record in ``after``, or more than
    ``max_drop`` of them."""
    out = []
    olds, news = Counter(c for c, _ in before), Counter(c for c, _ in after)
    for col, was in sorted(olds.items()):
        now = news[col]
        if now == 0:
            out.append(f"{col}: {was} records in OLD, none in NEW")
        elif was - now > max_drop * was:
            out.append(f"{col}: records dropped from {was} to {now} (more than {max_drop:.0%})")
    return out


def compare(old: Dict[str, Any], new: Dict[str, Any], max_drop: float = MAX_DROP) -> ReportDiff:
    before, after = _entries(old), _entries(new)
    diff = ReportDiff()
    for key in sorted(set(before) | set(after)):
        was = _settled(before.get(key))
        now = after.get(key, {}).get("verdict")
        if was == now:
            continue
        change = Change(key[0], key[1], was, now, (after.get(key) or before.get(key) or {}).get("line") or "")
        if now == Verdict.REGRESSION.value:
            diff.regressions.append(change)
        elif now == Verdict.UNEXPECTED_FIX.value:
            diff.unexpected_fixes.append(change)
        elif now == Verdict.SKIPPED.value and was is not None:
            diff.skipped.append(change)
        elif _passed(was) and _passed(now) is False and Verdict(now).needs_attention:
            diff.broken.append(change)
        elif was is None:
            diff.added.append(change)
        elif now is None:
            diff.removed.append(change)
        else:
            diff.changed.append(change)
    old_v, new_v = _versions(old), _versions(new)
    for col in sorted(set(old_v) & set(new_v)):
        moved = [
            f"{pkg} {old_v[col].get(pkg) or '-'} -> {new_v[col].get(pkg) or '-'}"
            # a package missing from one side's record was not recorded (an older record schema), not uninstalled
            for pkg in sorted(set(old_v[col]) & set(new_v[col]))
            if old_v[col][pkg] != new_v[col][pkg]
        ]
        if moved:
            diff.versions.append(f"{col}: " + ", ".join(moved))
    diff.lost = _lost(before, after, max_drop)
    diff.unreadable = [f"{s['file']}:{s['line']}: {s['reason']}" for s in new.get("skipped_lines") or []]
    return diff


def _fmt(change: Change) -> str:
    was = f"{symbol(change.old)} {change.old}" if change.old else "(no record)"
    now = f"{symbol(change.new)} {change.new}" if change.new else "(no record)"
    line = " ".join(change.line.split())
    mark = f" ({change.confirmation})" if change.confirmation else ""
    return f"  [{change.column}] {change.cell}: {was} -> {now}{mark}" + (
        f"\n      {line}" if line and change.new else ""
    )


def render(diff: ReportDiff, old_name: str = "OLD", new_name: str = "NEW") -> str:
    out = [f"fsdp-matrix diff: {old_name} -> {new_name}"]
    if diff.versions:
        out += ["Versions changed:"] + [f"  {v}" for v in diff.versions]
    groups = (
        ("NEW REGRESSIONS", diff.regressions),
        ("Passing cells that now need attention", diff.broken),
        ("New unexpected fixes (update matrix.yaml)", diff.unexpected_fixes),
        ("Cells now skipped", diff.skipped),
        ("Other verdict changes", diff.changed),
        ("Cells added", diff.added),
        ("Cells removed", diff.removed),
        ("Flaky: reruns did not repeat the flip (no alert, not bisected)", diff.flaky),
    )
    for title, changes in groups:
        if changes:
            out += ["", f"{title} ({len(changes)}):"] + [_fmt(c) for c in changes]
    if diff.lost:
        out += ["", f"Records lost ({len(diff.lost)}):"] + [f"  {one_line(c)}" for c in diff.lost]
    if diff.unreadable:
        out += ["", f"Lines that are not records ({len(diff.unreadable)}):"]
        out += [f"  {one_line(u)}" for u in diff.unreadable]
    if diff.empty:
        out.append("No verdict changed.")
    return "\n".join(out) + "\n"


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:  # nan fails both
        raise argparse.ArgumentTypeError(f"not a share from 0 to 1: {text!r}")
    return value


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m fsdp_matrix diff OLD NEW``; argv excludes 'diff'. 1 on an alert (a new REGRESSION, a passing cell
    that now needs attention, a cell now skipped), 2 on unreadable input."""
    parser = OneLineParser(
        prog="python -m fsdp_matrix diff", description="Cells whose verdict changed between two reports."
    )
    parser.add_argument("old", type=Path, help="report.json, results dir or cells.jsonl of the earlier run")
    parser.add_argument("new", type=Path, help="the same for the later run")
    parser.add_argument(
        "--max-drop",
        type=_share,
        default=MAX_DROP,
        help=f"share of a combo's records that may vanish without an alert (default {MAX_DROP})",
    )
    args = parser.parse_args(argv)
    try:
        old, new = load_report(args.old), load_report(args.new)
    except ReportInputError as exc:
        print(f"diff: {flat(exc)}", file=sys.stderr)
        return 2
    diff = compare(old, new, args.max_drop)
    sys.stdout.write(render(diff, str(args.old), str(args.new)))
    return 1 if diff.alerts else 0
