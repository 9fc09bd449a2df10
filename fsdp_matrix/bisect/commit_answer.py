"""The answer of a commit bisect: per cell a table of the tested commits and the first changed one (subject, date,
PR), the cost line, and the JSON written by ``--json`` (and read by the nightly and the gate).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any, Dict, List, Mapping, Optional, Tuple

from fsdp_matrix.bisect.commit_request import CommitInstaller, Line
from fsdp_matrix.bisect.commit_search import Found, last_line
from fsdp_matrix.bisect.outcome import Outcome
from fsdp_matrix.bisect.search import CellAnswer, Step, install_bound
from fsdp_matrix.clip import clip
from fsdp_matrix.envs.sources import redact_url
from fsdp_matrix.git import Commit


def table(commits: Dict[str, Commit], order: List[str], steps: List[Step], answer: CellAnswer, cell: str) -> str:
    """One row per tested commit, in line order (GOOD off the line first)."""
    rows = [("#", "commit", "subject", "outcome", "seconds")]
    index = {sha: i for i, sha in enumerate(order)}
    for step in sorted(steps, key=lambda s: index.get(s.candidate, -1)):
        seen = step.outcomes.get(cell)
        what = seen.describe() if seen else f"skipped: {clip(last_line(step.reason), 70)}"
        mark = {answer.first_changed: " <- first changed", answer.last_unchanged: " <- last unchanged"}
        position = str(index[step.candidate]) if step.candidate in index else "good"
        subject = clip(commits[step.candidate].subject, 50) if step.candidate in commits else ""
        rows.append(
            (position, step.candidate[:10], subject, what + mark.get(step.candidate, ""), f"{step.seconds:.1f}")
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(f"{c:<{w}}" for c, w in zip(r[:4], widths)) + f"  {r[4]:>7}" for r in rows)


def render(q: Line, found: Found, start: float) -> Dict[str, Optional[Commit]]:
    """Per cell: the table, the answer with short SHAs, and the first changed commit; then the cost line."""
    firsts: Dict[str, Optional[Commit]] = {}
    for cell in q.cells:
        answer = found.answers[cell]
        if len(q.cells) > 1:
            print(f"{cell}:")
        print(table(q.commits, q.line, found.steps, answer, cell))
        short = answer.answer
        for sha in filter(None, [answer.first_changed, answer.last_unchanged, *answer.untestable]):
            short = short.replace(sha, sha[:10])  # the answer names whole SHAs; a person reads the first ten
        print(short)
        first = firsts[cell] = q.commits.get(answer.first_changed or "")
        if first:
            pr = f" (PR #{first.pr})" if first.pr else ""
            print(f"first changed commit: {first.sha} {first.subject!r}, {first.date}{pr}")
            print(f"last unchanged commit: {answer.last_unchanged}")
    installs, failed = _installs(q.installer)
    print(
        f"{len(found.steps)} steps, {installs} installs"
        + (f" + {failed} that did not build or import" if failed else "")
        + f" (bound {install_bound(len(q.line))} over {len(q.line)} commits"
        + (f", +1 for {q.request.good} off the line" if q.off_line else "")
        + f"), {(time.monotonic() - start) / 60:.1f} min",
        flush=True,
    )
    return firsts


def _installs(installer: CommitInstaller) -> Tuple[int, int]:
    """(envs installed, install attempts that failed): a reused env is no install; a commit that does not build is
    tried again on every run, as git bisect skip would."""
    log = installer.base.log
    return sum(1 for e in log if e.ok and not e.reused), sum(1 for e in log if not e.ok)


def _answer_json(answer: Optional[CellAnswer], first: Optional[Commit], reference: Optional[Outcome]) -> Dict:
    reference = reference or (answer.reference if answer else None)
    return {
        "first_changed": answer.first_changed if answer else None,
        "last_unchanged": answer.last_unchanged if answer else None,
        "untestable": answer.untestable if answer else [],
        "commit": asdict(first) if first else None,
        "answer": answer.answer if answer else "the merge base does not behave like GOOD",
        "reference": asdict(reference) if reference else None,
    }


def to_json(q: Line, found: Found, firsts: Mapping[str, Optional[Commit]], start: float) -> Dict[str, Any]:
    """The JSON: first_changed, last_unchanged, commit: {sha, subject, date, pr} (of the first cell, and per cell
    under ``cells``), and every step with each cell's outcome."""
    cells, req = q.cells, q.request
    per_cell = {c: _answer_json(found.answers.get(c), firsts.get(c), found.references.get(c)) for c in cells}
    installs, failed = _installs(q.installer)
    return {
        "cell": cells[0],
        "combo": q.combo,
        "package": q.package,
        "repo": redact_url(req.git),
        "good": req.good,
        "bad": req.bad,
        "merge_base": q.merge_base,
        "commits": len(q.line),
        **per_cell[cells[0]],
        "cells": per_cell,
        "steps": [
            {
                "commit": s.candidate,
                "installed": s.installed,
                "outcome": asdict(s.outcomes[cells[0]]) if cells[0] in s.outcomes else None,
                "outcomes": {c: asdict(o) for c, o in s.outcomes.items()},
                "reason": s.reason,
                "seconds": round(s.seconds, 1),
            }
            for s in found.steps
        ],
        "installs": installs,
        "failed_installs": failed,
        "install_bound": install_bound(len(q.line)),
        "minutes": round((time.monotonic() - start) / 60, 2),
    }
