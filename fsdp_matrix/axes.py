"""Axes: the declared vocabulary of cell params (``axes:`` in matrix.yaml), value equality, and how a value is
spelled in a cell id.

Cell ids are public (users quote them, the nightly diffs them across harness versions), so the spelling here never
changes: ``adapter``, ``dtype``, ``orig``, ``wrap`` and ``model`` come first and bare, any other axis follows as
``name_value`` (``name0``/``name1`` for integers and booleans).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

from pydantic import Field, field_validator

from fsdp_matrix.rules import Scalar, Strict

BUILTIN_AXES = {"device": ("cpu", "cuda"), "world_size": None}
"""Axes every cell has besides its grid's: ``when`` may match them (world size: any positive integer)."""

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


def same_value(value: Any, want: Any) -> bool:
    """Axis values compare as written, except that YAML writes orig as 0/1 or false/true: those are alike."""
    if isinstance(value, bool) or isinstance(want, bool):
        return isinstance(value, (bool, int)) and isinstance(want, (bool, int)) and bool(value) == bool(want)
    return value == want


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


def cell_id(params: Dict[str, Any], world_size: int) -> str:
    names = [n for n in ID_ORDER if n in params] + sorted(n for n in params if n not in ID_ORDER)
    return "-".join([format_value(n, params[n]) for n in names] + [f"ws{world_size}"])


def shown(values: Optional[Iterable[Any]]) -> str:
    return "a positive integer" if values is None else ", ".join(map(repr, values))
