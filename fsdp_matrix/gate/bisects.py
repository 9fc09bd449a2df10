"""The commit bisect of the confirmed changes over the pull request's first-parent commits (bisect/commits.py, the
one commit bisect; bisect/wiring.py wires it): one search per combo and world size, its changed cells sharing every
step. The base's and the head's envs are already in the cache (and the base's records: the head's are never kept), so
the bisect installs only the commits between. A change the head made flaky is not bisected (flow.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from fsdp_matrix.axes import parse_layout
from fsdp_matrix.bisect import commits
from fsdp_matrix.errors import MatrixError
from fsdp_matrix.gate.changes import CellChange
from fsdp_matrix.gate.refs import Refs
from fsdp_matrix.gate.request import GateRequest
from fsdp_matrix.usage import flat

Bisect = Callable[[commits.CommitRequest], Tuple[int, Optional[Dict[str, Any]]]]
"""Runs one commit bisect: (exit code, its JSON answer). The default is ``bisect.commits.run``."""


@dataclass(frozen=True)
class Named:
    """What the bisect said about one changed cell."""

    combo: str
    """The combo's id."""
    cell: str
    """``case/cell``."""
    commit: Optional[commits.Commit]
    """The first commit whose outcome differs from the base's; None when the bisect could not name one."""
    answer: str
    """The bisect's one line (or why it did not run)."""


def _groups(changes: Sequence[CellChange]) -> Dict[Tuple[str, int], List[str]]:
    groups: Dict[Tuple[str, int], List[str]] = {}
    for change in changes:
        layout = parse_layout(change.cell.rsplit("/", 1)[-1]) or (2, 1)
        groups.setdefault((change.combo, layout[0]), []).append(change.cell)
    return groups


def _named(combo: str, cells: List[str], answer: Optional[Dict[str, Any]], code: int) -> List[Named]:
    if answer is None or answer.get("error"):
        why = (answer or {}).get("error") or f"the commit bisect exited {code} without an answer (see the log)"
        return [Named(combo, cell, None, why) for cell in cells]
    out = []
    for cell in cells:
        got = (answer.get("cells") or {}).get(cell) or {}
        commit = commits.Commit(**got["commit"]) if got.get("commit") else None
        out.append(Named(combo, cell, commit, str(got.get("answer") or "")))
    return out


def bisect_changes(
    req: GateRequest, refs: Refs, changes: Sequence[CellChange], bisect: Bisect = commits.run
) -> List[Named]:
    """Name the commit of every confirmed change, when the pull request has several commits; a bisect that
    cannot run says why for its cells."""
    if refs.pr_commits < 2:
        return []
    out: List[Named] = []
    for (combo, _), cells in _groups(changes).items():
        # as bisect --git runs it: each cell at its id's world size (one per search)
        step = dataclasses.replace(req.step, world_size=None)
        request = commits.CommitRequest(
            cells, req.pin.package, str(refs.repo), refs.base, refs.head, combo, list(req.holds), None, step
        )
        print(f"gate: {combo}: bisecting {len(cells)} changed cell(s) over {refs.pr_commits} commits", flush=True)
        try:
            code, answer = bisect(request)
        except MatrixError as exc:
            code, answer = 2, {"error": f"the commit bisect could not run: {flat(exc)}"}
        out.extend(_named(combo, cells, answer, code))
    return out
