"""The search of a commit bisect: GOOD first when it sits off the line (its merge base must behave like it), then
bisect/search.py's ``bisect_cells`` over the first-parent line, every cell in each step's launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from fsdp_matrix.bisect.commit_request import Line
from fsdp_matrix.bisect.outcome import Outcome
from fsdp_matrix.bisect.search import CellAnswer, Step, bisect_cells, install_bound
from fsdp_matrix.clip import clip
from fsdp_matrix.progress import Heartbeat


def same_observation(a: Outcome, b: Outcome) -> bool:
    """Two steps behave alike when the cell did the same thing; the verdict is left out, because rules judge each
    commit as its own release base and a commit on main is judged against an older release's rules."""
    return (a.status, a.error_type, a.message) == (b.status, b.error_type, b.message)


def last_line(reason: str) -> str:
    # an installer's reason ends with its most specific line; uv draws a tree in front of it
    lines = [line.strip(" │├╰─▶×") for line in reason.splitlines() if line.strip(" │├╰─▶×")]
    return lines[-1] if lines else reason


@dataclass
class Found:
    """What the search found."""

    steps: List[Step] = field(default_factory=list)
    """Every step, in the order run."""
    answers: Dict[str, CellAnswer] = field(default_factory=dict)
    """Per cell; empty when the merge base does not behave like GOOD."""
    references: Dict[str, Outcome] = field(default_factory=dict)
    """Per cell, GOOD's outcome when GOOD sits off the line."""
    stopped: Optional[int] = None
    """The exit code when the search stopped before bisecting the line."""
    untested: bool = False
    """It stopped because GOOD could not be tested: there is no answer to write."""


def _hooks(q: Line, beat: Heartbeat, steps: List[Step]) -> Dict[str, Any]:
    def started(candidate: str, todo: Sequence[str]) -> None:
        what = f"step {len(steps) + 1}: {q.package} {candidate[:10]}"
        beat.update(f"{what}: installing, then running {len(todo)} cell(s)", say=True)

    def ended(step: Step) -> None:
        steps.append(step)
        seen = sorted({o.describe() for o in step.outcomes.values()})
        what = " | ".join(seen) if seen else f"skipped: {clip(last_line(step.reason), 90)}"
        print(f"  [{len(steps)}] {step.candidate[:10]} {what} ({step.seconds:.0f}s)", flush=True)

    return dict(same=same_observation, on_step=ended, on_start=started)


def _check_good(q: Line, hooks: Dict[str, Any], found: Found) -> Optional[Dict[int, Dict[str, Outcome]]]:
    """GOOD sits off the line (a patch release): the merge base must behave like it, or the line cannot answer.
    The merge base's outcomes, known at the line's index 0; None (and ``found.stopped``) when it cannot answer."""
    good, base, cells = q.good, q.merge_base, q.cells
    bisect_cells(q.installer, q.runner, [good, base], cells, q.package, **hooks)
    at = {s.candidate: s for s in found.steps}
    found.references = dict(at[good].outcomes) if good in at else {}
    at_base = dict(at[base].outcomes) if base in at else {}
    untested = [c for c in cells if c not in found.references]
    if untested:
        print(f"{q.request.good} ({good[:10]}) could not be tested for {', '.join(untested)}: {at[good].reason}")
        found.stopped, found.untested = 1, True
        return None
    unlike = [c for c in cells if c in at_base and not same_observation(at_base[c], found.references[c])]
    for cell in unlike:
        g = q.request.good
        print(
            f"{cell}: the merge base {base[:10]} does not behave like {g}: "
            f"{found.references[cell].describe()} at {g}, {at_base[cell].describe()} at the merge base. "
            f"The change is on {g}'s branch, not on the first-parent line to {q.request.bad}: bisect "
            f"that branch instead (--good {base[:10]} --bad {g}); stopping."
        )
    if unlike:
        found.stopped = 1
        return None
    return {0: at_base}


def search(q: Line) -> Found:
    """GOOD first when it is off the line, then the line itself; every cell in each step's launch."""
    bound = install_bound(len(q.line))
    req = q.request
    print(
        f"bisecting {', '.join(q.cells)} on combo {q.combo} over {len(q.line)} first-parent commits of {q.package} "
        f"({q.merge_base[:10]} = merge base of {req.good} and {req.bad} .. {req.bad} = {q.line[-1][:10]}); "
        f"at most {bound} installs plus skips" + (f", plus {req.good} itself" if q.off_line else ""),
        flush=True,
    )
    found = Found()
    with Heartbeat("bisect", "starting") as beat:
        q.runner.status = beat.update
        hooks = _hooks(q, beat, found.steps)
        known: Optional[Dict[int, Dict[str, Outcome]]] = {}
        if q.off_line:
            known = _check_good(q, hooks, found)
            if known is None:
                return found
        found.answers = bisect_cells(q.installer, q.runner, q.line, q.cells, q.package, known=known, **hooks).cells
    return found
