"""Tests for fsdp_matrix.export.simplify: constant locals and dead side-effect-free assignments."""

from __future__ import annotations

import textwrap

from fsdp_matrix.export.simplify import pure_functions, simplify


def _fn(text: str) -> str:
    return textwrap.dedent(text).strip()


def test_constant_local_folds_into_its_readers():
    text = _fn(
        """
        def f(model):
            orig = 1
            return wrap(model, None if orig is None else bool(orig))
        """
    )
    assert simplify(text, set()) == "def f(model):\n    return wrap(model, True)"


def test_dead_assignment_goes_only_when_side_effect_free():
    texts = {
        "names": "def names(model):\n    out = []\n    for n, p in model.named_parameters():\n        out.append(n)\n"
        "    return sorted(out)",
        "saves": "def saves(model):\n    model.save('x')\n    return 1",
    }
    pure = pure_functions(texts)
    assert pure == {"names"}
    text = _fn(
        """
        def f(model):
            # what it was
            seen = names(model)
            kept = saves(model)
            go(model)
            return 1
        """
    )
    out = simplify(text, pure)
    assert "seen" not in out and "what it was" not in out and "kept = saves(model)" in out


def test_the_statement_before_a_raise_stays():
    text = _fn(
        """
        def f(model):
            x = names(model)
            raise RuntimeError('not reproduced')
        """
    )
    assert "x = names(model)" in simplify(text, {"names"})
