"""The check answer as the text ``check`` prints."""

from __future__ import annotations

from typing import List

from fsdp_matrix.check.answer import CaseAnswer, CheckAnswer, Expectation

WIDTH = 8
"""Other and plumbing settings shown before '... and N more' (every one is in --json)."""
HEADINGS = {
    "applies": "Known failures these settings meet on these versions",
    "may-apply": "May apply, depending on what the script does or a setting no file gave",
    "not-run": "Cases the matrix does not run on these versions (a fact about a release, not a verdict)",
    "trains": "Cases these settings reach that are expected to train",
}


def _list(title: str, items: List[str], width: int = WIDTH) -> List[str]:
    if not items:
        return []
    shown = ", ".join(items[:width]) + (f" ... and {len(items) - width} more (--json)" if len(items) > width else "")
    return [f"{title} ({len(items)}): {shown}"]


def _head(answer: CheckAnswer) -> List[str]:
    lines = [f"versions ({answer.versions_from}): {', '.join(f'{p} {v}' for p, v in answer.versions.items())}"]
    lines += [f"outside what was observed: {line}" for line in answer.outside_observed]
    lines.append(f"files: {answer.read}")
    for f in answer.files:
        lines.append(f"  {f.kind}: {f.path} as {f.cls or '?'} ({f.loader})")
        lines += [f"    {f.kind} says: {note}" for note in f.notes]
    if answer.out_of_scope:
        return lines
    lines.append(f"setup ({answer.entry} entry, {answer.layout}):")
    lines += [f"  {axis}={'|'.join(v) or '(no case covers it)'}  <- {answer.axes_from.get(axis, '')}" for axis, v in
              answer.axes.items()]  # fmt: skip
    lines += [f"  note: {note}" for note in answer.notes]
    if answer.unknown_axes:
        lines.append(f"  not in these files: {', '.join(answer.unknown_axes)} (every value is considered)")
    # all of them: these are the settings a user may expect a case to cover
    lines += _list("not covered by any case: FSDP, PEFT and quantization settings", answer.not_covered, 10**6)
    lines += _list("not covered by any case: other settings", answer.other_settings)
    lines += _list("not covered by any case: launch plumbing", answer.plumbing)
    return lines


def _expectation_lines(e: Expectation, failing: bool) -> List[str]:
    lines = [f"   {e.rule} ({e.when}): {e.outcome}; {e.cells} matching cell(s), e.g. {', '.join(e.examples)}"]
    if e.conditions:
        lines.append(f"      only if: {'; '.join(e.conditions)}")
    if not failing:
        return lines
    lines.append(f"      reproduces on: {e.reproduces}; source: {e.source}")
    lines.append(f"      evidence: {e.evidence}: {e.evidence_line}")
    lines.append(f"      fixed in: {e.fixed}")
    for w in e.workarounds:
        lines.append(
            f"      works instead: {w.change} ({w.rule} {w.when}: {w.cells} cell(s), e.g. {', '.join(w.examples)})"
        )
        lines += [f"        {w.observed}"] if w.observed else []
    if e.workarounds_note:
        lines.append(f"      works instead: {e.workarounds_note}")
    return lines


def _case_lines(n: int, c: CaseAnswer) -> List[str]:
    lines = [f"{n}. {c.case}: {c.title}", f"   upstream: {c.report}"]
    if c.needs:
        lines.append(f"   applies only if the script {c.needs}")
    for e in c.expectations:
        failing = e.kind in ("error", "hang")
        if failing or c.status in ("trains", "not-run"):
            lines += _expectation_lines(e, failing)
    return lines


def render_text(answer: CheckAnswer) -> str:
    lines = _head(answer)
    if answer.records:
        lines.append(answer.records)
    if answer.out_of_scope:
        return "\n".join(lines + [f"out of scope: {answer.out_of_scope}"]) + "\n"
    n = 0
    for status, heading in HEADINGS.items():
        mine = [c for c in answer.cases if c.status == status]
        if not mine:
            continue
        lines += ["", f"{heading} ({len(mine)}):"]
        if status == "trains":
            lines += [f"  {c.case} ({c.matching_cells} cell(s) at entry {c.entry})" for c in mine]
            continue
        for c in mine:
            n += 1
            lines += _case_lines(n, c)
    applies = sum(c.status == "applies" for c in answer.cases)
    lines += ["", f"{applies} known failure(s) apply" + ("" if applies else ": none of the matrix's cases fails here")]
    return "\n".join(lines) + "\n"
