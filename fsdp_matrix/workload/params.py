"""A cell's axis values, read in a repro: one helper that refuses a value the code does not handle.

``run(params, ctx)`` gets the cell's params as matrix.yaml's grid gives them. Reading ``params["wrap"]`` directly
lets a value nobody handles fall through to some default branch and run the wrong thing; ``axis`` names the axis,
the value and the values the repro takes instead. It imports nothing from the harness and reads no matrix.yaml, so
a standalone run and an exported script (which inlines the workload modules) behave the same.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

_NO_DEFAULT: Any = object()
"""``default`` for an axis the cell must have."""


class UnknownAxisValue(ValueError):
    """A cell's params name a value (or lack an axis) the repro does not handle."""


def _axis_same(value: Any, want: Any) -> bool:
    # YAML writes orig as 0/1 or false/true: those are alike, as in matrix.yaml's `when`
    if isinstance(value, bool) or isinstance(want, bool):
        return isinstance(value, (bool, int)) and isinstance(want, (bool, int)) and bool(value) == bool(want)
    return value == want


def axis(params: Mapping[str, Any], name: str, choices: Iterable[Any], default: Any = _NO_DEFAULT) -> Any:
    """``params[name]`` as the one of ``choices`` it equals; ``default`` when the cell has no such axis.

    Raises UnknownAxisValue for a value not in ``choices``, or a missing axis without a default.
    """
    options = tuple(choices)
    if name not in params:
        if default is _NO_DEFAULT:
            raise UnknownAxisValue(
                f"axis {name!r} missing from the cell's params (this repro takes: {_axis_choices(options)})"
            )
        return default
    value = params[name]
    for option in options:
        if _axis_same(value, option):
            return option
    raise UnknownAxisValue(f"axis {name!r}: unknown value {value!r} (this repro takes: {_axis_choices(options)})")


def flag(params: Mapping[str, Any], name: str, default: Any = _NO_DEFAULT) -> Any:
    """A 0/1 axis (``orig``, ``autocast``, ``cache``, ``strict``) as a bool; ``default`` when the cell has none."""
    value = axis(params, name, (0, 1), default)
    return bool(value) if name in params else value


def _axis_choices(options: Iterable[Any]) -> str:
    return ", ".join(repr(o) for o in options)
