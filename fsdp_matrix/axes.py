"""Axes: the declared vocabulary of cell params (``axes:`` in matrix.yaml), value equality, and how a value is
spelled in a cell id.

Cell ids are public (users quote them, the nightly diffs them across harness versions), so the spelling here never
changes: ``adapter``, ``dtype``, ``orig``, ``wrap`` and ``model`` come first and bare, any other axis follows as
``name_value`` (``name0``/``name1`` for integers and booleans).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

from pydantic import Field, field_validator

from fsdp_matrix.match import same_value  # noqa: F401 (re-exported: its home before match.py)
from fsdp_matrix.rules import Scalar, Strict

BUILTIN_AXES = {"device": ("cpu", "cuda"), "world_size": None, "nodes": None}
"""Axes every cell has besides its grid's: ``when`` may match them (world size, nodes: any positive integer)."""

LAYOUT_AXES = ("world_size", "nodes")
"""Built-in axes a grid may pin: the cell's launch layout (global ranks, and the nodes they are spread over), not a
param handed to the repro. A grid without them takes the run's layout (``--world-size``, 1 node). They are spelled
as the id's suffix (``-ws4``, ``-ws4-n2``), never as ``name_value``."""

ID_ORDER = ("adapter", "dtype", "orig", "wrap", "model")
"""Axes named in the id in this order, bare; any other axis follows, sorted, as ``name_value``."""


class Axis(Strict):
    """One declared axis: what it means and the values a grid may give it."""

    meaning: str = Field(min_length=1)
    """One line: what the axis changes in the run, with its abbreviations spelled out."""
    values: List[Scalar] = Field(min_length=1)
    """Every value a grid or a ``when`` may name."""

    @field_validator("meaning")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if "\n" in value.strip():
            raise ValueError("meaning must be one line")
        return value


def allowed(value: Any, values: Optional[Iterable[Any]]) -> bool:
    """Is ``value`` one of ``values``? ``None`` stands for world size: any positive integer."""
    if values is None:
        return isinstance(value, int) and not isinstance(value, bool) and value > 0
    return any(same_value(value, a) for a in values)


def format_value(name: str, value: Any) -> str:
    """How one axis value is spelled in a cell id."""
    if isinstance(value, bool):
        value = int(value)
    if name == "orig":
        return f"orig{value}"
    if name in ID_ORDER:
        return str(value)
    if isinstance(value, int):
        return f"{name}{value}"
    return f"{name}_{value}"


def cell_id(params: Dict[str, Any], world_size: int, nodes: int = 1) -> str:
    """The public id: params in ID_ORDER then sorted, then ``ws<global world size>``, then ``n<nodes>`` when the
    cell spans more than one node (a one-node id is what it always was)."""
    names = [n for n in ID_ORDER if n in params] + sorted(n for n in params if n not in ID_ORDER)
    tail = [f"ws{world_size}"] + ([f"n{nodes}"] if nodes > 1 else [])
    return "-".join([format_value(n, params[n]) for n in names] + tail)


def parse_layout(cell: str) -> Optional[Tuple[int, int]]:
    """(world size, nodes) from an id's suffix (``...-ws4-n2``, ``...-ws2``), or None when it has none."""
    match = re.search(r"-ws(\d+)(?:-n(\d+))?$", "-" + cell)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2) or 1)


def check_layout(where: str, grid: Dict[str, List[Any]]) -> None:
    """A grid's pinned layout: positive integers, ``nodes`` only beside ``world_size``, each world size a multiple
    of each node count (every node runs the same number of ranks). Raises ValueError naming the key."""
    for name in LAYOUT_AXES:
        for value in grid.get(name, ()):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}.{name}: {value!r} is not a positive integer")
    if "nodes" in grid and "world_size" not in grid:
        raise ValueError(f"{where}.nodes: give world_size beside it (the global ranks the nodes share)")
    for ws in grid.get("world_size", ()):
        for nodes in grid.get("nodes", [1]):
            if ws % nodes:
                raise ValueError(f"{where}.world_size: {ws} ranks do not split evenly over {nodes} nodes")


def shown(values: Optional[Iterable[Any]]) -> str:
    return "a positive integer" if values is None else ", ".join(map(repr, values))


VALUE_CHARS = re.compile(r"[A-Za-z0-9_.+-]+")
"""What an axis value may be made of: it is spelled into cell ids, which ``run CELL``, ``bisect`` and ``export`` take
as ``CASE/CELL`` (a ``/`` would split it) and which name files and command lines (no whitespace)."""

MAX_CELLS = 10_000
"""Cells one matrix may expand to per device and world size; FSDP_MATRIX_MAX_CELLS raises it. The repo's has 202:
a grid above the limit is almost surely a mistake, and counting it out would exhaust memory."""


def max_cells() -> int:
    text = os.environ.get("FSDP_MATRIX_MAX_CELLS", "")
    if not text:
        return MAX_CELLS
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"FSDP_MATRIX_MAX_CELLS={text!r}: not a positive integer")
    return int(text)


def value_problem(value: Any) -> Optional[str]:
    """Why ``value`` cannot be an axis value, or None."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return f"{value!r} is not a usable number"
    if isinstance(value, str) and not VALUE_CHARS.fullmatch(value):
        return f"{value!r}: an axis value is letters, digits and _ . + - (it is spelled into cell ids)"
    return None


def name_problem(name: str) -> Optional[str]:
    """Why ``name`` cannot be an axis name, or None."""
    if not name.isidentifier() or not name.isascii():
        return f"axis name {name!r} is not an identifier (letters, digits, _)"
    return None


def check_grids(case_id: str, index: int, grids: List[Dict[str, List[Any]]]) -> int:
    """Check one case's grids as cell ids need them; return how many cells they give (counted, not expanded).

    Raises ValueError naming ``cases[index](case_id).grids[j].axis``: an empty grid, a bad axis name or value, the
    same value twice in one list (``orig: [1, true]``), or two different values spelled alike in a cell id (``1``
    and ``"1"`` both give ``orig1``), which would merge their cells silently.
    """
    spelled: Dict[Tuple[str, str], Any] = {}
    cells = 0
    for j, grid in enumerate(grids):
        where = f"cases[{index}]({case_id}).grids[{j}]"
        if not grid:
            raise ValueError(f"{where}: an empty grid has no axes, so no cell; name at least one axis")
        check_layout(where, grid)
        if "device" in grid:
            raise ValueError(f"{where}.device: the device is the run's (--device), not a grid axis")
        for name, values in grid.items():
            problem = name_problem(name)
            if problem:
                raise ValueError(f"{where}: {problem}")
            for k, value in enumerate(values):
                problem = value_problem(value)
                if problem:
                    raise ValueError(f"{where}.{name}: {problem}")
                text = format_value(name, value)
                for other in values[:k]:
                    if same_value(value, other) or format_value(name, other) == text:
                        raise ValueError(
                            f"{where}.{name}: {other!r} and {value!r} are one cell-id value ({text}); list it once"
                        )
                first = spelled.setdefault((name, text), value)
                if not same_value(first, value):
                    raise ValueError(f"{where}.{name}: {value!r} and {first!r} both give {text!r} in a cell id")
        cells += math.prod(len(v) for v in grid.values())
    return cells
