"""How a change between base and head counts, and which cells changed."""

from __future__ import annotations

import pytest

from fsdp_matrix.bisect.outcome import Outcome
from fsdp_matrix.gate.changes import (
    CHANGED,
    FAILING_KINDS,
    FIX_BROKEN,
    FIXED,
    NEW_FAILURE,
    NOW_SKIPPED,
    NOW_TRAINS,
    ConfirmContext,
    as_seen,
    changed_cells,
    kind_of,
    not_judged,
)
from fsdp_matrix.gate.runs import AtCommit, Seen


@pytest.mark.parametrize(
    ("base", "head", "kind", "fails"),
    [
        ("fix-holds", "REGRESSION", FIX_BROKEN, True),
        ("fix-holds", "hang", FIX_BROKEN, True),
        ("fix-holds", "env-error", FIX_BROKEN, True),
        ("reproduced", "DIFFERENT-ERROR", NEW_FAILURE, True),
        ("reproduced", "crash", NEW_FAILURE, True),
        ("skipped", "REGRESSION", NEW_FAILURE, True),
        ("reproduced", "UNEXPECTED-FIX", NOW_TRAINS, False),
        ("DIFFERENT-ERROR", "UNEXPECTED-FIX", NOW_TRAINS, False),
        ("REGRESSION", "fix-holds", FIXED, False),
        ("hang", "reproduced", FIXED, False),
        ("hang", "crash", CHANGED, False),
        ("fix-holds", "skipped", NOW_SKIPPED, True),
        ("reproduced", "skipped", NOW_SKIPPED, True),
        ("skipped", "skipped", CHANGED, False),
    ],
)
def test_kind_of_a_change(base: str, head: str, kind: str, fails: bool) -> None:
    assert kind_of(base, head) == kind
    assert (kind in FAILING_KINDS) is fails


def _at(commit: str, **cells: Seen) -> AtCommit:
    return AtCommit("c", commit, {k.replace("_", "/"): v for k, v in cells.items()})


def test_changed_cells_compare_what_the_cell_did_and_its_verdict() -> None:
    ok = Seen(Outcome.observed("ok", verdict="fix-holds"))
    err = Seen(Outcome.observed("error", "ValueError", "shape 4 at 0x7f00", verdict="REGRESSION"))
    same_err = Seen(Outcome.observed("error", "ValueError", "shape 8 at 0x7f11", verdict="REGRESSION"))
    other = Seen(Outcome.observed("error", "TypeError", "nope", verdict="REGRESSION"))
    base = _at("b", a_x=ok, a_y=err, a_z=err, a_w=ok)
    head = _at("h", a_x=err, a_y=same_err, a_z=other, a_w=Seen(None, "no record"))
    found = {c.cell: c for c in changed_cells(base, head)}
    # numbers and addresses are noise (the bisect's normalised message): a/y did the same thing; a/w has no result
    # at the head: not judged, never a change nor "no change"
    assert sorted(found) == ["a/x", "a/z"]
    assert [(n.cell, n.why) for n in not_judged(base, head)] == [("a/w", "no result at the head: no record")]
    assert found["a/x"].kind == FIX_BROKEN
    assert found["a/z"].kind == CHANGED and not found["a/z"].fails


def test_a_head_that_does_not_build_is_a_change_and_a_base_without_a_result_is_not_judged() -> None:
    ok = Seen(Outcome.observed("ok", verdict="fix-holds"))
    unbuilt = AtCommit("c", "h", {"a/w": Seen(None, "toypkg abc did not build"), "a/v": Seen(None, "no")}, False)
    base = _at("b", a_w=ok, a_v=Seen(None, "no record"))
    [found] = changed_cells(base, unbuilt)
    assert (found.cell, found.kind, found.head.verdict) == ("a/w", FIX_BROKEN, "env-error")
    assert "did not build" in found.head.describe()
    assert [(n.cell, n.why) for n in not_judged(base, unbuilt)] == [("a/v", "no result at the base: no record")]


def test_the_default_confirm_step_takes_every_change_as_seen() -> None:
    base = _at("b", a_x=Seen(Outcome.observed("ok", verdict="fix-holds")))
    head = _at("h", a_x=Seen(Outcome.observed("error", "E", "m", verdict="REGRESSION")))
    changes = changed_cells(base, head)
    got = as_seen(changes, ConfirmContext(runs=None, combos={}, base="b", head="h"))  # type: ignore[arg-type]
    assert got.confirmed == changes and got.flaky == [] and got.reruns == 0
