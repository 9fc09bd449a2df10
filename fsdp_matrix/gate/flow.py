"""The gate's steps, in order: select -> refs -> run base -> run head -> changed cells -> confirm -> bisect.

``run_gate`` takes its collaborators as parameters: ``runs`` (who runs cells at a commit), ``confirm`` (which
changes repeat: the one call site between the changed cells and the bisect) and ``bisect`` (the commit bisect).
The defaults are the real ones; a test gives fakes, a confirm module gives its rerun.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from fsdp_matrix.bisect import commits
from fsdp_matrix.cells import expand
from fsdp_matrix.errors import EnvError, UnknownCellError
from fsdp_matrix.gate.bisects import Bisect, bisect_changes
from fsdp_matrix.gate.changes import MADE_FLAKY, CellChange, Confirm, ConfirmContext, changed_cells, not_judged
from fsdp_matrix.gate.confirming import rerun_changes
from fsdp_matrix.gate.refs import Refs, resolve_refs
from fsdp_matrix.gate.request import GateRequest
from fsdp_matrix.gate.runs import AtCommit, CellRuns, LaunchCellRuns
from fsdp_matrix.gate.summary import GateResult
from fsdp_matrix.matrix import Combo, load_matrix
from fsdp_matrix.progress import Heartbeat


@dataclass(frozen=True)
class Selection:
    """The combos and cells a gate runs."""

    combos: List[Combo]
    """The combos, in the order asked (default: the newest CPU combo)."""
    cells: List[str]
    """Cell keys of the selected cases, the same on every combo."""


def select(req: GateRequest) -> Selection:
    """The combos and cells; UnknownCellError (one line) for an id matrix.yaml does not have."""
    matrix = load_matrix(req.step.matrix)
    try:
        combos = [matrix.combo(i) for i in dict.fromkeys(req.combos)] or [matrix.newest("cpu")]
        cells = [c.key for c in expand(matrix, req.step.device, req.step.world_size or 2, cases=req.cases)]
    except UnknownCellError as exc:
        if req.step.matrix is None:
            raise
        # the messages say matrix.yaml: name the file the ids were looked up in
        raise UnknownCellError(str(exc).replace("in matrix.yaml", f"in {req.step.matrix}")) from None
    return Selection(combos, cells)


def _run_ends(refs: Refs, sel: Selection, runs: CellRuns, beat: Heartbeat, result: GateResult) -> List[CellChange]:
    """Every combo at the base, then at the head; the changed cells of each. A base that does not build leaves
    nothing to compare its combo against: a problem, and its head is not run."""
    changes: List[CellChange] = []
    total = 2 * len(sel.combos)
    for i, combo in enumerate(sel.combos):
        ends: List[AtCommit] = []
        for j, (name, sha) in enumerate((("base", refs.base), ("head", refs.head))):
            beat.update(f"[{2 * i + j + 1}/{total}] {combo.id}: {len(sel.cells)} cells at the {name} {sha[:10]}", True)
            at = _run_end(runs, combo, sha, sel.cells, name, beat)
            if at.reused:
                result.reused.append(f"{combo.id}@{sha[:10]}")
            ends.append(at)
            if not at.built and name == "base":
                why = next(iter(at.cells.values())).why if at.cells else "did not build"
                result.problems.append(f"{combo.id}: the base {sha[:10]} cannot be run: {why}")
                break
        if len(ends) == 2:
            changes += _judge_combo(combo.id, ends[0], ends[1], beat, result)
    return changes


_UNSURE = ("hang", "crash")
"""Base verdicts that say more about the machine than about the commit: rerun before anything is compared to them."""


def _run_end(runs: CellRuns, combo: Combo, sha: str, cells: List[str], name: str, beat: Heartbeat) -> AtCommit:
    """One end's cells. The head runs fresh (its records are never read back from the cache: a lucky pass there
    would stick); the base is read back, but a base cell that hung, crashed or left no result (a flake kept by
    commit would hide the head's failure from every later gate) is run again, fresh, before it is compared."""
    if name == "head":
        return runs.run(combo, sha, cells, fresh=True)
    at = runs.run(combo, sha, cells)
    unsure = [c for c, s in at.cells.items() if s.outcome is None or s.verdict in _UNSURE] if at.built else []
    if unsure:
        beat.say(f"{combo.id}: {len(unsure)} cell(s) hung, crashed or left no result at the base: running them again")
        again = runs.run(combo, sha, unsure, fresh=True)
        at.cells.update({c: s for c, s in again.cells.items() if s.outcome is not None})
    return at


def _judge_combo(combo: str, base: AtCommit, head: AtCommit, beat: Heartbeat, result: GateResult) -> List[CellChange]:
    """The changed cells of one combo; its cells without a result at either end are listed as not judged, and a
    combo with no result at all is silent (an alert: nothing of it was seen)."""
    found, missing = changed_cells(base, head), not_judged(base, head)
    result.not_judged += missing
    result.judged += len(base.cells) - len(missing)
    if base.cells and len(missing) == len(base.cells):
        result.silent.append(combo)
    extra = f" ({len(missing)} not judged: no result at the base or the head)" if missing else ""
    beat.say(f"{combo}: {len(found)} of {len(base.cells)} cells changed{extra}")
    return found


def run_gate(
    req: GateRequest,
    *,
    runs: Optional[CellRuns] = None,
    confirm: Confirm = rerun_changes,
    bisect: Bisect = commits.run,
) -> GateResult:
    """The whole gate; MatrixError or EnvError (one line) for bad input, found before anything is installed."""
    sel = select(req)
    refs = resolve_refs(req, req.step.cache / "sources")
    if refs.base == refs.head:
        raise EnvError(
            f"HEAD is the base (or behind it): nothing to gate ({req.head} {refs.head[:10]} is in {refs.base_ref})"
        )
    result = GateResult(req.pin.package, refs, [c.id for c in sel.combos], len(sel.cells), req.allow_missing)
    print(
        f"gate: {req.pin.package} {refs.head[:10]} against {refs.base[:10]} (merge base with {refs.base_ref}, "
        f"{refs.pr_commits} commits between): {len(sel.cells)} cells on {', '.join(result.combos)}",
        flush=True,
    )
    with Heartbeat("gate", "starting") as beat:
        runs = runs or LaunchCellRuns(req, say=beat.say, status=beat.update)
        result.changes = _run_ends(refs, sel, runs, beat, result)
        # the confirm step: only the changes that repeat count, fail the gate and are bisected
        ctx = ConfirmContext(runs, {c.id: c for c in sel.combos}, refs.base, refs.head)
        result.confirmation = confirm(result.changes, ctx)
        # a cell the head made flaky has no answer that repeats: nothing for a search to find
        repeating = [c for c in result.confirmation.confirmed if c.kind != MADE_FLAKY]
        if req.bisect and repeating:  # every change is of a judged combo: an unbuilt base leaves none
            beat.update(f"bisecting {len(repeating)} changed cell(s)", True)
            result.named = bisect_changes(req, refs, repeating, bisect)
    return result
