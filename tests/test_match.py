"""fsdp_matrix.match: a cell's context and an env against a rule's when, versions and absent, in yes/no and in words."""

from __future__ import annotations

from types import SimpleNamespace

from fsdp_matrix import axes, cells, expectations, match

CTX = {"wrap": "fsdp2", "orig": True, "device": "cpu", "world_size": 1, "nodes": 1}


def _rule(**fields):
    return SimpleNamespace(**{"when": {}, "versions": {}, "absent": [], **fields})


def test_when_versions_and_absent_in_that_order():
    env = {"torch": "2.6.0+cpu", "trl": "0.12.0"}
    assert match.why(_rule(when=[{"wrap": "fsdp1"}, {"orig": 0}]), CTX, env) == (
        False,
        "when [0] wrap: 'fsdp2' != 'fsdp1'; [1] orig: True != 0",
    )
    assert match.why(_rule(when={"orig": 1}, versions={"torch": ">=2.7"}), CTX, env) == (
        False,
        "versions: torch 2.6.0+cpu not >=2.7",
    )
    assert match.why(_rule(absent=["trl"]), CTX, env) == (False, "absent: trl 0.12.0 is installed")
    assert match.why(_rule(versions={"torch": "<2.7"}), CTX, env) == (True, "matches (torch 2.6.0+cpu <2.7)")
    for rule in (_rule(when={"orig": 0}), _rule(absent=["trl"]), _rule(versions={"torch": "<2.7"})):
        assert match.hits(rule, CTX, env) is match.why(rule, CTX, env)[0]


def test_a_requirement_is_unmet_only_where_its_when_holds():
    req = _rule(when={"wrap": ["fsdp2", "fsdp1"]}, device=None, min_world_size=2, reason="two ranks")
    assert match.unmet(req, CTX) == "needs world size >= 2, this run has 1: two ranks"
    assert match.unmet(req, {**CTX, "wrap": "peft_policy"}) is None
    cuda = _rule(device="cuda", min_world_size=None, reason="GPU only")
    assert match.unmet(cuda, CTX) == "needs cuda, this run is on cpu: GPU only"


def test_the_old_homes_name_the_same_functions():
    assert axes.same_value is match.same_value and cells.matches is match.matches
    assert cells.which_mismatch is match.which_mismatch and expectations.version_matches is match.version_matches
    assert match.same_value(1, True) and not match.same_value(0, True) and match.same_value("a", "a")
