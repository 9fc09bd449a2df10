"""Cells: one case's grids expanded into concrete, stably named runs."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

from fsdp_matrix.axes import LAYOUT_AXES, cell_id, parse_layout
from fsdp_matrix.errors import UnknownCellError
from fsdp_matrix.match import matches, unmet, which_mismatch  # noqa: F401 (re-exported: their home before match.py)
from fsdp_matrix.matrix import Case, Matrix, Requirement


@dataclass(frozen=True)
class Cell:
    """One run of one case: a point of its grid, on a given device and world size."""

    case: str
    """Case id from matrix.yaml."""
    params: Tuple[Tuple[str, Any], ...]
    """Axis name -> value, sorted by name (a tuple so cells hash)."""
    device: str = "cpu"
    """``cpu`` (gloo) or ``cuda`` (nccl)."""
    world_size: int = 2
    """Ranks in the process group, over all nodes: the cell runs at exactly this size."""
    nodes: int = 1
    """Nodes those ranks are spread over (``world_size / nodes`` ranks each): 1, or a multi-node launch."""

    @property
    def params_dict(self) -> Dict[str, Any]:
        return dict(self.params)

    @property
    def layout(self) -> Tuple[int, int]:
        """(world size, nodes): the launch this cell needs. A session runs each layout in launches of its own."""
        return self.world_size, self.nodes

    @property
    def id(self) -> str:
        return cell_id(self.params_dict, self.world_size, self.nodes)

    @property
    def key(self) -> str:
        """Unique across cases: ``case/cell``."""
        return f"{self.case}/{self.id}"

    def context(self) -> Dict[str, Any]:
        """What expectation and requirement rules can match on: params plus device and world size."""
        return {**self.params_dict, "device": self.device, "world_size": self.world_size, "nodes": self.nodes}


def expand_case(case: Case, device: str = "cpu", world_size: int = 2, nodes: int = 1) -> List[Cell]:
    """The case's cells. ``world_size``/``nodes`` is the run's layout, taken by every grid that pins none
    (LAYOUT_AXES); a grid that pins one gives its cells that layout whatever the run's."""
    cells: Dict[str, Cell] = {}
    for grid in case.grids:
        names = sorted(n for n in grid if n not in LAYOUT_AXES)
        # a grid that pins a world size is on one node unless it pins nodes too; one that pins neither takes the run's
        layouts = grid.get("world_size", [world_size]), grid.get("nodes", [1 if "world_size" in grid else nodes])
        for ws, n in itertools.product(*layouts):
            for values in itertools.product(*(grid[name] for name in names)):
                cell = Cell(case.id, tuple(zip(names, values)), device, ws, n)
                cells.setdefault(cell.id, cell)
    return list(cells.values())


def expand(
    matrix: Matrix,
    device: str = "cpu",
    world_size: int = 2,
    cases: Optional[Iterable[str]] = None,
    nodes: int = 1,
) -> List[Cell]:
    """Every cell of the matrix, or of the ``cases`` named (each must exist: a typo must not select nothing)."""
    wanted = set(cases) if cases else None
    for case_id in sorted(wanted or ()):
        matrix.case(case_id)  # raises UnknownCellError naming it
    return [
        c
        for case in matrix.cases
        if wanted is None or case.id in wanted
        for c in expand_case(case, device, world_size, nodes)
    ]


def find_cell(matrix: Matrix, ref: str, device: str = "cpu", world_size: Optional[int] = None) -> Cell:
    """Resolve ``case/cell`` or a bare cell id (when unique) to a Cell.

    The layout comes from the id's ``wsN`` / ``wsN-nK`` suffix unless a world size is given, so an id copied from
    a report resolves as is.
    """
    case_id, _, cid = ref.rpartition("/")
    nodes = 1
    if world_size is None:
        world_size, nodes = parse_layout(cid) or (2, 1)
    try:
        cells = expand(matrix, device, world_size, [case_id] if case_id else None, nodes)
    except UnknownCellError as exc:
        raise UnknownCellError(f"no cell {ref!r} in matrix.yaml: {exc}") from None
    hits = [c for c in cells if c.id == cid]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise UnknownCellError(f"no cell {ref!r} in matrix.yaml")
    raise UnknownCellError(f"cell id {cid!r} is in several cases ({', '.join(h.case for h in hits)}); write CASE/CELL")


def unmet_requirement(requires: Iterable[Requirement], cell: Cell) -> Optional[str]:
    """The reason a cell cannot run on this device/world size, or None (the first unmet of ``requires``)."""
    ctx = cell.context()
    return next((reason for req in requires if (reason := unmet(req, ctx))), None)
