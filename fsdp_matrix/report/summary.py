"""``python -m fsdp_matrix summary OLD NEW``: what changed between two runs, as a step-summary markdown and as a
message of at most 2,900 characters that a Slack step can post (its text limit for a section block is 3,000).

OLD and NEW are each what ``diff`` reads (a results dir, a cells.jsonl, a report.json) or a pytest report-log JSONL
(pytest-reportlog, ``pytest --report-log FILE``: the format upstream CI jobs feed their ``log_reports.py``). The
comparison is diff.py's ``compare``; this module only groups its changes the way a reader triages them and writes
them out:

- regressions: a new REGRESSION, a passing cell that now needs attention (diff's ``broken``), and in a report-log
  without verdicts a test that passed (or was absent) and now fails;
- fixes: a new UNEXPECTED-FIX, and a cell that needed attention (or failed) and now passes;
- other changes: every other verdict change, cells added or removed, flips the reruns called flaky.

A report-log is read tolerantly, one ``TestReport`` line at a time; another line type is passed over, and a line
that is not JSON is named as unreadable (diff's ``skipped_lines``), never dropped silently. Per test (``nodeid``):

- ``user_properties`` (pairs ``[name, value]``, or a mapping) may carry ``verdict``, ``combo``, ``cell``
  (``case/cell``), ``versions`` (a mapping, or its JSON), ``line``, and ``expected`` / ``observed`` (or
  ``expected_signature`` / ``observed_signature``), which make the line when there is none: what the pytest plugin
  stamps on each cell's test (``record_properties``) is read as it is;
- the verdict is ``user_properties``' ``verdict`` when there is one, else pytest's own outcome: ``passed``,
  ``failed``, ``skipped``, or ``error`` for a failure outside the test's call;
- the cell is ``user_properties``' ``cell``, else the test id's parameter (``test_cell[case/cell]``), else the nodeid;
- the column is ``user_properties``' ``combo``, else ``pytest``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from fsdp_matrix.clip import clip, first_line
from fsdp_matrix.report.diff import Change, ReportDiff, ReportInputError, compare, load_report
from fsdp_matrix.report.markdown import md_escape
from fsdp_matrix.report.style import symbol
from fsdp_matrix.usage import OneLineParser, flat
from fsdp_matrix.verdicts import Verdict

MESSAGE_LIMIT = 2900
"""Characters a message may hold: under Slack's 3,000 for one section block, with room for the poster's own words."""
LINE_CHARS = 300
"""The most one change may take of a message: a cell with a huge name still leaves room for the others."""
REPORT_LOG_COLUMN = "pytest"
"""Column of a report-log test whose ``user_properties`` name no combo."""
PASSING = {"passed", Verdict.REPRODUCED.value, Verdict.FIX_HOLDS.value}
FAILING = {"failed", "error"}
"""pytest's own outcomes that fail a run (``error``: a failure in setup or teardown)."""
OUTCOMES = {"passed", "skipped"} | FAILING
"""pytest's own outcomes, the verdicts of a report-log whose tests carry none (``skipped`` is a verdict too)."""


@dataclass
class Summary:
    """The changes between two runs, grouped for a reader: regressions first."""

    regressions: List[Change] = field(default_factory=list)
    """New REGRESSIONs, passing cells that now need attention, tests that now fail."""
    fixes: List[Change] = field(default_factory=list)
    """New UNEXPECTED-FIXes, and cells that needed attention (or failed) and now pass."""
    other: List[Change] = field(default_factory=list)
    """Every other change: verdicts, cells added or removed, flaky flips."""
    notes: List[str] = field(default_factory=list)
    """Versions that moved, records lost, lines of NEW that are not records."""
    cells: int = 0
    """Cells in NEW."""

    @property
    def count(self) -> int:
        return len(self.regressions) + len(self.fixes) + len(self.other)

    def groups(self) -> Tuple[Tuple[str, List[Change]], ...]:
        return (("Regressions", self.regressions), ("Fixes", self.fixes), ("Other changes", self.other))


# ---------------------------------------------------------------------------------------------- report-log input


def is_report_log(path: Path) -> bool:
    """Whether ``path`` is a file whose first JSON line has pytest-reportlog's ``$report_type``."""
    if not path.is_file():
        return False
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.strip():
                    data = json.loads(line)
                    return isinstance(data, dict) and "$report_type" in data
    except (OSError, ValueError):
        return False
    return False


def _properties(report: Dict[str, Any]) -> Dict[str, Any]:
    """``user_properties`` as a mapping: pytest's pairs (lists in JSON) or a mapping; anything else is none."""
    raw = report.get("user_properties") or []
    if isinstance(raw, dict):
        return dict(raw)
    pairs = [p for p in raw if isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str)]
    return {name: value for name, value in pairs}


def _mapping(value: Any) -> Dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


def _cell_of(nodeid: str, props: Dict[str, Any]) -> str:
    if props.get("cell"):
        return str(props["cell"])
    if nodeid.endswith("]") and "[" in nodeid:
        return nodeid[nodeid.index("[") + 1 : -1]
    return nodeid


def _outcome(reports: List[Dict[str, Any]]) -> str:
    """pytest's verdict on one test from its setup, call and teardown reports."""
    by_phase = {r.get("when"): r.get("outcome") for r in reports}
    if any(r.get("outcome") == "failed" and r.get("when") != "call" for r in reports):
        return "error"
    if by_phase.get("call") in ("passed", "failed", "skipped"):
        return str(by_phase["call"])
    return "skipped" if "skipped" in by_phase.values() else "error"


def _failure_line(reports: List[Dict[str, Any]]) -> str:
    for rep in reports:
        longrepr = rep.get("longrepr")
        if isinstance(longrepr, dict):
            crash = longrepr.get("reprcrash") or {}
            longrepr = crash.get("message") if isinstance(crash, dict) else None
        elif isinstance(longrepr, list) and len(longrepr) == 3:  # a skip: [path, line, reason]
            longrepr = longrepr[2]
        if isinstance(longrepr, str) and longrepr.strip():
            return first_line(longrepr, 300)
    return ""


def _entry(nodeid: str, reports: List[Dict[str, Any]]) -> Tuple[str, str, Dict[str, Any], Dict[str, Any]]:
    """(column, cell, summary as diff reads it, versions) of one test."""
    props: Dict[str, Any] = {}
    for rep in reports:
        props.update(_properties(rep))
    verdict = str(props.get("verdict") or _outcome(reports))
    line = str(props.get("line") or "")
    expected = props.get("expected") or props.get("expected_signature")
    observed = props.get("observed") or props.get("observed_signature")
    if not line and (expected or observed):
        line = f"expected {expected or '?'} / observed {observed or '?'}"
    summary = {"verdict": verdict, "line": line or _failure_line(reports)}
    return (
        str(props.get("combo") or REPORT_LOG_COLUMN),
        _cell_of(nodeid, props),
        summary,
        _mapping(props.get("versions")),
    )


def _read_report_log(path: Path) -> Tuple[Dict[str, List[Dict[str, Any]]], List[Dict[str, Any]]]:
    """Test reports by nodeid, in file order, and the lines that could not be read."""
    tests: Dict[str, List[Dict[str, Any]]] = {}
    skipped: List[Dict[str, Any]] = []
    with path.open(encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except ValueError as exc:
                skipped.append({"file": str(path), "line": number, "reason": f"not JSON: {exc}"})
                continue
            if isinstance(data, dict) and data.get("$report_type") == "TestReport" and data.get("nodeid"):
                tests.setdefault(str(data["nodeid"]), []).append(data)
    return tests, skipped


def report_log_report(path: Path) -> Dict[str, Any]:
    """A pytest report-log turned into the report JSON that diff.compare reads (entries, columns, skipped lines)."""
    try:
        tests, skipped = _read_report_log(path)
    except OSError as exc:
        raise ReportInputError(f"{path}: {exc}") from None
    if not tests:
        raise ReportInputError(f"{path}: a pytest report-log with no TestReport line")
    entries: Dict[str, Dict[str, Any]] = {}
    versions: Dict[str, Dict[str, Any]] = {}
    for nodeid, reports in tests.items():
        column, cell, summary, found = _entry(nodeid, reports)
        entries.setdefault(column, {})[cell] = summary
        if found and column not in versions:
            versions[column] = found
    columns = [{"id": c, "versions": versions.get(c, {})} for c in entries]
    return {"entries": entries, "columns": columns, "skipped_lines": skipped}


def load_run(path: Path) -> Dict[str, Any]:
    """OLD or NEW as report JSON: a pytest report-log, else whatever diff.load_report reads."""
    path = Path(path)
    return report_log_report(path) if is_report_log(path) else load_report(path)


# ------------------------------------------------------------------------------------------------------ grouping


def _passes(verdict: Optional[str]) -> bool:
    return verdict in PASSING


def _fails(verdict: Optional[str]) -> bool:
    return verdict in FAILING or (verdict is not None and verdict not in PASSING and _known_attention(verdict))


def _known_attention(verdict: str) -> bool:
    try:
        return Verdict(verdict).needs_attention
    except ValueError:
        return False


def summarise(old: Dict[str, Any], new: Dict[str, Any]) -> Summary:
    """diff.compare's changes, grouped: regressions, fixes, other changes."""
    diff: ReportDiff = compare(old, new)
    out = Summary(regressions=diff.regressions + diff.broken, fixes=list(diff.unexpected_fixes))
    for change in diff.changed + diff.skipped + diff.added:
        if change.new in FAILING and not _fails(change.old):
            out.regressions.append(change)
        elif _passes(change.new) and _fails(change.old):
            out.fixes.append(change)
        else:
            out.other.append(change)
    out.other += diff.removed + diff.flaky
    out.notes = [f"versions: {v}" for v in diff.versions]
    out.notes += [f"records lost: {v}" for v in diff.lost] + [f"not a record: {v}" for v in diff.unreadable]
    out.cells = sum(len(cells) for cells in new.get("entries", {}).values())
    return out


# ------------------------------------------------------------------------------------------------------ writing


def _verdict_text(verdict: Optional[str]) -> str:
    """A verdict with its grid symbol; pytest's own outcomes (a report-log without verdicts) as they are."""
    if not verdict:
        return "(no record)"
    return verdict if verdict in OUTCOMES else f"{symbol(verdict)} {verdict}"


def counts(summary: Summary) -> str:
    """``N regressions, N fixes, N other changes (N cells)``, or that nothing changed."""
    if not summary.count:
        return f"no verdict changed ({summary.cells} cells)"
    return (
        f"{len(summary.regressions)} regressions, {len(summary.fixes)} fixes, {len(summary.other)} other changes "
        f"({summary.cells} cells)"
    )


def render_markdown(summary: Summary, old_name: str = "OLD", new_name: str = "NEW") -> str:
    out = ["## fsdp-matrix: what changed", "", f"{md_escape(old_name)} → {md_escape(new_name)}: {counts(summary)}"]
    for title, changes in summary.groups():
        if not changes:
            continue
        out += ["", f"### {title} ({len(changes)})", "", "| combo | cell | was | now | expected / observed |"]
        out.append("|---|---|---|---|---|")
        out += [
            f"| {md_escape(c.column)} | {md_escape(c.cell)} | {md_escape(_verdict_text(c.old))} | "
            f"{md_escape(_verdict_text(c.new))} | {md_escape(c.line)} |"
            for c in changes
        ]
    if summary.notes:
        out += ["", "### Notes", ""] + [f"- {md_escape(n)}" for n in summary.notes]
    return "\n".join(out) + "\n"


def _change_line(change: Change) -> str:
    text = f"• [{change.column}] {change.cell}: {change.old or '(none)'} → {change.new or '(none)'}"
    return clip(text, LINE_CHARS, flat=True)


def render_message(summary: Summary, limit: int = MESSAGE_LIMIT) -> str:
    """The counts and the changed cells, regressions first, cut with "… and N more" to at most ``limit``
    characters (a group's title is shown only with at least one of its cells). ``limit`` is above ``LINE_CHARS`` plus
    the tail, so the counts line always fits."""
    out = [clip(f"fsdp-matrix: {counts(summary)}", LINE_CHARS, flat=True)]
    items = [(title if i == 0 else "", c) for title, changes in summary.groups() for i, c in enumerate(changes)]
    total = len(items)
    # room kept for the longest "… and N more" there could be: the tail never pushes the message over the limit
    room = limit - len(f"\n… and {total} more")
    size = len(out[0])
    for index, (title, change) in enumerate(items):
        line = (f"{title}:\n" if title else "") + _change_line(change)
        if size + 1 + len(line) > (limit if index == total - 1 else room):
            break
        out.append(line)
        size += 1 + len(line)
    shown = len(out) - 1
    if shown < total:
        out.append(f"… and {total - shown} more")
    return "\n".join(out)


def write_outputs(summary: Summary, markdown: Optional[Path], message: Optional[Path], names: Sequence[str]) -> None:
    if markdown is not None:
        # appended: $GITHUB_STEP_SUMMARY collects every step's markdown in the one file
        with markdown.open("a", encoding="utf-8") as fh:
            fh.write(render_markdown(summary, *names))
    text = render_message(summary)
    if message is not None:
        message.write_text(text, encoding="utf-8")
    sys.stdout.write(text + "\n")


def main(argv: Optional[Iterable[str]] = None) -> int:
    """``python -m fsdp_matrix summary OLD NEW [--markdown FILE] [--message FILE]``; argv excludes 'summary'. 0 when
    written (``diff`` is the command whose exit code gates), 2 on unreadable input."""
    parser = OneLineParser(
        prog="python -m fsdp_matrix summary",
        description="What changed between two runs: a step-summary markdown and a message of at most "
        f"{MESSAGE_LIMIT:,} characters.",
    )
    parser.add_argument("old", type=Path, help="results dir, cells.jsonl, report.json or pytest report-log (earlier)")
    parser.add_argument("new", type=Path, help="the same for the later run")
    parser.add_argument("--markdown", type=Path, help="append the markdown here (e.g. $GITHUB_STEP_SUMMARY)")
    parser.add_argument("--message", type=Path, help=f"write the message (at most {MESSAGE_LIMIT:,} characters) here")
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        old, new = load_run(args.old), load_run(args.new)
    except ReportInputError as exc:
        print(f"summary: {flat(exc)}", file=sys.stderr)
        return 2
    try:
        write_outputs(summarise(old, new), args.markdown, args.message, (str(args.old), str(args.new)))
    except OSError as exc:
        print(f"summary: cannot write: {flat(exc)}", file=sys.stderr)
        return 2
    return 0
