"""Hypothesis over the gate's decisions: scripted outcomes at the base, the head and their reruns, for both cells of
the toy pull request, through the gate's command (``gate.cli.main``), and the invariants every answer must keep:

- absence is never a pass: a cell with no result at the base or the head is listed as not judged, and the gate
  fails when more are than ``--allow-missing`` allows, or when the whole combo is silent;
- a head that fails in every run, against base reruns that pass, fails the gate, whatever the first base run (a
  flake the cache kept) said;
- a head that fails in some runs and passes in others, against base reruns that pass, fails the gate (made flaky);
- a change is listed as flaky only when the head did not repeat, or when the base reruns give the head's result;
- the exit code is 1 exactly when a change fails or too many cells are not judged (no combo here fails to build).

Refs are resolved once (they are not what is tested); everything after them is the gate's own code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdp_matrix.gate import flow
from fsdp_matrix.gate.cli import main
from fsdp_matrix.gate.refs import resolve_refs
from fsdp_matrix.gate.request import from_args, parser
from fsdp_matrix.matrix import load_matrix
from tests.gate.support import Scripted, make_pr_repo, toy_cells, write_toy_matrix

VALUES = [
    None,
    "fix-holds",
    "reproduced",
    "REGRESSION",
    ("REGRESSION", "another message: a flake of the machine"),
    "DIFFERENT-ERROR",
    "UNEXPECTED-FIX",
    "hang",
    "crash",
    "skipped",
]
"""What one run of a cell can give: no record, or a verdict (one REGRESSION with another message)."""
PASSING = ("fix-holds", "reproduced")
NOT_BAD = (*PASSING, "UNEXPECTED-FIX")
value = st.sampled_from(VALUES)


def _verdict(v) -> Optional[str]:
    return v[0] if isinstance(v, tuple) else v


def _bad(v) -> bool:
    return _verdict(v) not in NOT_BAD


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("gate-decisions")
    shas = make_pr_repo(root / "toypkg")
    matrix = write_toy_matrix(root, load_matrix().combo("old").pins.model_dump())
    argv = ["--pin", f"toypkg={root / 'toypkg'}@pr", "--combos", "toy", "--matrix", str(matrix)]
    argv += ["--cache", str(root / "cache"), "--json", str(root / "gate.json"), "--no-bisect"]
    req = from_args(parser().parse_args(argv))
    return argv, root / "gate.json", shas, list(toy_cells(matrix).values()), resolve_refs(req, root / "cache" / "src")


cell_script = st.tuples(value, value, st.tuples(value, value, value))
"""(the base's first run, what every later base run gives, the head's first run and its two reruns)."""


class Expect:
    """What the gate must say of one cell, from its script (the gate's policy: a base run that hung, crashed or left
    no result is run again before it is compared; the reruns of a changed cell: 2 at the head, 2 at the base)."""

    def __init__(self, base_first, base_later, head: Tuple) -> None:
        unsure = base_first is None or _verdict(base_first) in ("hang", "crash")
        self.base = base_later if unsure and base_later is not None else base_first
        self.later, self.head = base_later, head
        self.missing = self.base is None or head[0] is None
        self.changed = not self.missing and self.base != head[0]
        self.heads = [h for h in head if h is not None]
        self.base_passes = base_later in PASSING

    @property
    def must_fail(self) -> bool:
        """A change whose head fails in some or all runs while every base rerun passes."""
        return self.changed and self.base_passes and any(_bad(h) for h in self.heads)

    @property
    def may_be_flaky(self) -> bool:
        return len(set(self.heads)) > 1 or (self.later is not None and self.later == self.head[0])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scripts=st.tuples(cell_script, cell_script), allow=st.sampled_from([None, 0, 1, 2]))
def test_the_gates_decisions_keep_their_invariants(toy, scripts, allow) -> None:
    argv, out, shas, cells, refs = toy
    script: Dict[Tuple[str, str], List] = {}
    expect = {}
    for cell, (base_first, base_later, head) in zip(cells, scripts):
        script[("base", cell)] = [base_first, base_later]
        script[("head", cell)] = list(head)
        expect[cell] = Expect(base_first, base_later, head)
    out.unlink(missing_ok=True)
    extra = [] if allow is None else ["--allow-missing", str(allow)]
    with mock.patch.object(flow, "resolve_refs", lambda req, cache: refs):
        code = main(argv + extra, runs=Scripted(shas["m0"], script))
    data = json.loads(Path(out).read_text())
    changed = {c["cell"]: c for c in data["changed"]}
    flaky = {c["cell"] for c in data["flaky"]}
    missing = {n["cell"] for n in data.get("not_judged", [])}
    # absence is never a pass
    assert missing == {c for c, e in expect.items() if e.missing}
    too_many = len(missing) > (allow or 0) or len(missing) == len(cells)
    if too_many:
        assert code == 1, (code, data)
    for cell, e in expect.items():
        if e.must_fail:
            assert cell in changed and changed[cell]["fails"], (cell, data)
        if cell in flaky:
            assert e.may_be_flaky, (cell, data)
    fails = any(c["fails"] for c in data["changed"])
    assert code == (1 if fails or too_many else 0), (code, data)
