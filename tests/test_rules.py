"""One rule grammar: the same Rule in a case's expect and requires and in the platform's skips and signatures; one
``when`` (a mapping, or a list of mappings); one word for the reason (``skip:``, ``reason:`` read as it)."""

from __future__ import annotations

import pytest

from fsdp_matrix import rules
from fsdp_matrix.cells import Cell, unmet_requirement
from fsdp_matrix.errors import MatrixConfigError
from fsdp_matrix.expectations import expected_for, trace
from fsdp_matrix.matrix import parse_matrix
from tests.helpers import matrix_data

VERSIONS = {"torch": "2.13.0", "peft": "0.21.2", "transformers": "5.23.0", "accelerate": "1.15.0"}
PLATFORM = {
    "skips": [{"id": "no-fsdp2", "when": [{"wrap": "fsdp2"}], "reason": "no FSDP2 here", "source": "observed"}],
    "signatures": [
        {"id": "sig", "errors": [{"type": "OSError", "match": "x"}], "skip": "an env fact", "source": "observed"}
    ],
}


def _case(**changes):
    data = matrix_data(platform=PLATFORM)
    data["cases"][0].update(changes)
    return parse_matrix(data).case("lora-requires-grad")


def test_every_place_holds_the_one_rule_model_and_reason_is_skip():
    case = _case()
    everything = [*case.requires, *case.expect, *case.platform.skips, *case.platform.signatures]
    assert {type(r) for r in everything} == {rules.Rule}
    assert case.requires[0].skip == case.requires[0].reason == "sharding needs 2 ranks"  # written as reason:
    assert case.platform.skips[0].skip == "no FSDP2 here" and case.platform.signatures[0].reason == "an env fact"


def test_a_case_rule_when_may_be_a_list_of_mappings_as_everywhere():
    first = {"when": [{"orig": 1}, {"wrap": "fsdp2"}], "ok": True, "id": "either", "source": "s"}
    case = _case(expect=[first, {"ok": True, "source": "s"}])
    cells = {c: expected_for(case, Cell(case.id, p, "cpu", 2), VERSIONS) for c, p in _cells().items()}
    assert cells["orig1"].rule == 0 and cells["orig0"].rule == 1
    # the platform skip's list `when` comes first for the fsdp2 cell, and the trace says so in its words
    assert cells["fsdp2"].platform == "no-fsdp2"
    said = trace(case, Cell(case.id, _cells()["orig0"], "cpu", 2), VERSIONS).trials
    assert [t.why for t in said if t.name == "expect[0]"] == [
        "when [0] orig: 0 != 1; [1] wrap: 'decoder_layer' != 'fsdp2'"
    ]


def _cells():
    base = (("adapter", "lora"), ("dtype", "fp32"), ("model", "llama"))
    return {
        "orig0": (*base, ("orig", 0), ("wrap", "decoder_layer")),
        "orig1": (*base, ("orig", 1), ("wrap", "decoder_layer")),
        "fsdp2": (*base, ("wrap", "fsdp2")),
    }


def test_a_requirement_list_when_and_its_skip():
    req = {"when": [{"wrap": "fsdp2"}, {"orig": 1}], "min_world_size": 2, "skip": "needs two"}
    case = _case(requires=[req])
    at_one = {k: unmet_requirement(case.requires, Cell(case.id, p, "cpu", 1)) for k, p in _cells().items()}
    assert at_one == {
        "orig0": None,
        "orig1": "needs world size >= 2, this run has 1: needs two",
        "fsdp2": at_one["orig1"],
    }


@pytest.mark.parametrize(
    "where, rule, message",
    [
        ("expect", {"ok": True, "source": "s", "errors": [{"type": "X", "match": "y"}]}, "expect[0].errors: Extra"),
        ("expect", {"ok": True, "source": "s", "min_world_size": 2}, "expect[0].min_world_size: Extra inputs"),
        ("expect", {"ok": True}, "expect[0].source: Field required"),
        ("requires", {"min_world_size": 2, "skip": "a", "versions": {"torch": ">1"}}, "requires[0].versions: Extra"),
        ("requires", {"min_world_size": 2, "skip": "a", "reason": "b"}, "give the reason once"),
        ("requires", {"min_world_size": 2, "ok": True}, "requires[0].ok: Extra inputs are not permitted"),
    ],
)
def test_each_place_refuses_what_it_does_not_take_in_one_line(where, rule, message):
    data = matrix_data()
    data["cases"][0][where] = [rule]
    with pytest.raises(MatrixConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_matrix(data)


@pytest.mark.parametrize(
    "kind, change, message",
    [
        ("skips", {"id": "a.b"}, r"skips\[0\]\(a.b\).id: String should match pattern"),
        ("skips", {"ok": True}, "needs exactly one of"),
        ("signatures", {"errors": []}, r"signatures\[0\]\(sig\).errors: Field required"),
        ("signatures", {"source": None}, r"signatures\[0\]\(sig\).source"),
        (
            "signatures",
            {"errors": [{"type": "OSError", "match": "x", "warning": {"type": "UserWarning", "match": "y"}}]},
            "an error of `errors` takes no warning",
        ),
    ],
)
def test_platform_rules_keep_their_shape(kind, change, message):
    platform = {k: [dict(r) for r in v] for k, v in PLATFORM.items()}
    platform[kind][0].update(change)
    platform[kind][0] = {k: v for k, v in platform[kind][0].items() if v is not None}
    with pytest.raises(MatrixConfigError, match=message):
        parse_matrix(matrix_data(platform=platform))
