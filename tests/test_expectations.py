import pytest

from fsdp_matrix.cells import Cell
from fsdp_matrix.expectations import Expected, expected_for, signature_matches, trace, version_matches
from fsdp_matrix.matrix import parse_matrix
from tests.helpers import matrix_data

CURRENT = {"torch": "2.13.0+cpu", "peft": "0.21.2", "transformers": "5.23.0"}


def _cell(**params):
    return Cell("lora-requires-grad", tuple(sorted(params.items())))


def test_first_matching_rule_wins_with_versions():
    case = parse_matrix(matrix_data()).case("lora-requires-grad")
    e = expected_for(case, _cell(orig=0, wrap="decoder_layer"), CURRENT)
    assert (e.kind, e.error_type, e.rule) == ("error", "ValueError", 0)
    old_torch = expected_for(case, _cell(orig=0, wrap="decoder_layer"), {**CURRENT, "torch": "2.0.1"})
    assert old_torch.rule == 1
    assert expected_for(case, _cell(orig=1, wrap="decoder_layer"), CURRENT).kind == "ok"
    skip = expected_for(case, _cell(orig=1, wrap="decoder_layer"), {**CURRENT, "peft": "0.10.0"})
    assert skip.kind == "skip" and skip.reason == "too old"


def test_no_rule_is_kind_none():
    data = matrix_data()
    data["cases"][0]["expect"] = data["cases"][0]["expect"][:1]
    case = parse_matrix(data).case("lora-requires-grad")
    assert expected_for(case, _cell(orig=1, wrap="decoder_layer"), CURRENT).kind == "none"


def test_version_matching_ignores_local_labels_and_missing_packages():
    assert version_matches("==2.13.0", "2.13.0+cpu")
    assert version_matches(">=2.1", "2.13.0+cu121")
    assert not version_matches(">=0.14", "0.13.2")
    assert not version_matches(">=0", None)


def test_signature_type_regex_and_module_prefix():
    e = Expected("error", "ValueError", "uniform `?requires_grad`?", "torch.distributed.fsdp._flat_param")
    msg = "Must flatten tensors with uniform `requires_grad` when `use_orig_params=False`"
    loc = "torch.distributed.fsdp._flat_param._validate_tensors_to_flatten"
    assert signature_matches(e, "ValueError", msg, loc)
    assert signature_matches(e, "ValueError", msg.replace("`", ""), loc)  # issue threads drop backticks
    assert not signature_matches(e, "TypeError", msg, loc)
    assert not signature_matches(e, "ValueError", "Must flatten tensors with uniform dtype", loc)
    assert not signature_matches(e, "ValueError", msg, "torch.distributed.fsdp._wrap_utils.x")
    assert not signature_matches(e, "ValueError", msg, "torch.distributed.fsdp._flat_param_x.y")
    qualified = Expected("error", "IndexError", "tuple index")
    assert signature_matches(qualified, "IndexError", "tuple index out of range", None)
    assert signature_matches(Expected("error", "CheckFailed", "x"), "fsdp_matrix.errors.CheckFailed", "x", None)


PLATFORM = {
    "skips": [
        {
            "id": "fsdp2-no-cpu",
            "when": {"wrap": "fsdp2", "device": "cpu"},
            "versions": {"torch": "<2.6"},
            "reason": "FSDP2 has no CPU path",
            "source": "observed",
        }
    ],
    "signatures": [
        {
            "id": "fsdp2-no-cpu",
            "when": {"device": "cpu"},
            "versions": {"torch": "<2.7"},
            "errors": [{"type": "AttributeError", "match": "record_event"}],
            "reason": "FSDP2 has no CPU path",
            "source": "observed",
        }
    ],
}


def _platform_case():
    return parse_matrix(matrix_data(platform=PLATFORM)).case("lora-requires-grad")


def test_platform_skip_comes_before_a_broad_ok_of_the_case():
    case = _platform_case()
    e = expected_for(case, _cell(wrap="fsdp2"), {**CURRENT, "torch": "2.5.1"})
    assert (e.kind, e.platform, e.rule, e.reason) == ("skip", "fsdp2-no-cpu", None, "FSDP2 has no CPU path")
    assert expected_for(case, _cell(wrap="fsdp2"), CURRENT).kind == "ok"  # torch 2.13: the case's ok
    on_cuda = Cell("lora-requires-grad", (("wrap", "fsdp2"),), "cuda")
    assert expected_for(case, on_cuda, {**CURRENT, "torch": "2.5.1"}).kind == "ok"


def test_signatures_ride_along_where_they_apply_and_survive_json():
    case = _platform_case()
    e = expected_for(case, _cell(wrap="fsdp2"), {**CURRENT, "torch": "2.6.0"})
    assert e.kind == "ok" and [s["id"] for s in e.signatures] == ["fsdp2-no-cpu"]
    assert Expected.from_json(e.to_json()) == e
    assert expected_for(case, _cell(wrap="fsdp2"), CURRENT).signatures == ()
    assert "signatures" not in expected_for(case, _cell(wrap="fsdp2"), CURRENT).to_json()


def test_trace_gives_every_trial_and_expected_for_is_its_outcome():
    case = _platform_case()
    cell = Cell("lora-requires-grad", (("wrap", "fsdp2"),), "cpu", 1)
    tr = trace(case, cell, {**CURRENT, "torch": "2.6.0"})
    assert [t.stage for t in tr.trials] == ["requires", "platform skip"] + ["case rule"] * 4 + ["platform signature"]
    req, skip, r0, r1, r2, r3, sig = tr.trials
    assert req.matched and req.decides and "world size >= 2" in req.why and tr.requirement
    assert not skip.matched and skip.why == "versions: torch 2.6.0 not <2.6"
    assert not r0.matched and r0.why == "when orig: this cell has no orig axis"
    assert not r2.matched and r2.why == "versions: peft 0.21.2 not <0.11"
    assert r3.matched and r3.decides and r3.outcome == "ok"
    assert sig.matched and not sig.decides and "AttributeError: /record_event/" in sig.outcome
    assert tr.expected == expected_for(case, cell, {**CURRENT, "torch": "2.6.0"})


def test_trace_names_the_failing_when_value_and_list():
    case = _platform_case()
    tr = trace(case, _cell(orig=1, wrap="decoder_layer"), CURRENT)
    assert tr.trials[1].why == "when wrap: 'decoder_layer' != 'fsdp2'"
    assert tr.trials[2].why == "when orig: 1 != 0"


def test_a_skip_for_an_absent_package_applies_only_where_it_is_absent():
    from fsdp_matrix.matrix import load_matrix

    matrix = load_matrix()
    case = matrix.case("trl-qlora-upcast")
    cell = next(c for c in case_cells(case) if dict(c.params).get("wrap") == "decoder_layer")
    pins = matrix.combo("current").pins.model_dump()
    assert pins["trl"] == "1.16.0"
    without = {k: v for k, v in pins.items() if k != "trl"}
    skipped = trace(case, cell, without)
    assert skipped.expected.kind == "skip" and skipped.expected.platform == "trl-not-pinned"
    ran = trace(case, cell, pins)
    assert ran.expected.platform != "trl-not-pinned"
    why = next(t.why for t in ran.trials if "trl-not-pinned" in t.name)
    assert why == "absent: trl 1.16.0 is installed"


def test_optional_pins_are_left_out_where_a_combo_has_none():
    from fsdp_matrix.matrix import Pins

    five = dict(torch="2.13.0", peft="0.21.2", transformers="5.23.0", accelerate="1.15.0", bitsandbytes="0.50.2")
    assert Pins(**five).model_dump() == five
    assert Pins(**five, trl="1.16.0").model_dump() == {**five, "trl": "1.16.0"}


def case_cells(case):
    from fsdp_matrix.cells import expand_case

    return expand_case(case, "cpu", 2)


# ---- hang and warning expectations --------------------------------------------------------------------------------


def _one_rule_case(rule):
    data = matrix_data()
    data["cases"][0]["expect"] = [rule]
    return parse_matrix(data).case("lora-requires-grad")


def test_a_hang_rule_carries_its_timeout_and_where_the_stack_must_be():
    case = _one_rule_case({"hang": {"timeout_s": 20, "stack": "all_gather"}, "source": "observed"})
    e = expected_for(case, _cell(orig=1, wrap="decoder_layer"), CURRENT)
    assert (e.kind, e.timeout_s, e.match) == ("hang", 20, "all_gather")
    assert Expected.from_json(e.to_json()) == e
    assert e.describe() == "hang within 20s, a rank's stack matching /all_gather/"
    # any other rule leaves the cell on the launch's own timeout
    plain = parse_matrix(matrix_data()).case("lora-requires-grad")
    assert expected_for(plain, _cell(orig=1), CURRENT).timeout_s is None


def test_warning_rules_say_a_warning_appears_or_does_not():
    warned = _one_rule_case({"warning": {"type": "UserWarning", "match": "requires_grad"}, "source": "observed"})
    e = expected_for(warned, _cell(orig=1, wrap="decoder_layer"), CURRENT)
    assert (e.kind, e.warning) == ("warning", {"type": "UserWarning", "match": "requires_grad"})
    assert e.describe() == "ok, with UserWarning: /requires_grad/"
    assert Expected.from_json(e.to_json()) == e
    quiet = _one_rule_case({"ok": True, "no_warning": {"type": "UserWarning", "match": "x"}, "source": "observed"})
    q = expected_for(quiet, _cell(orig=1, wrap="decoder_layer"), CURRENT)
    assert (q.kind, q.no_warning) == ("ok", {"type": "UserWarning", "match": "x"})
    assert q.describe() == "ok, without UserWarning: /x/"
    assert Expected.from_json(q.to_json()) == q


@pytest.mark.parametrize(
    "rule,message",
    [
        ({"hang": {"timeout_s": 0}, "source": "s"}, "timeout_s"),
        ({"hang": {"timeout_s": 10, "stack": "("}, "source": "s"}, "invalid regex"),
        ({"hang": {"timeout_s": 10}, "ok": True, "source": "s"}, "needs exactly one of ok/error/skip/hang/warning"),
        ({"warning": {"type": "UserWarning", "match": "["}, "source": "s"}, "invalid regex"),
        (
            {"error": {"type": "X", "match": "y"}, "no_warning": {"type": "W", "match": "z"}, "source": "s"},
            "no_warning goes with ok",
        ),
    ],
)
def test_malformed_hang_and_warning_rules_are_one_line(rule, message):
    from fsdp_matrix.errors import MatrixConfigError

    data = matrix_data()
    data["cases"][0]["expect"] = [rule]
    with pytest.raises(MatrixConfigError) as err:
        parse_matrix(data)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_every_expectation_is_as_before_the_evidence_moved_out_of_matrix_yaml():
    """matrix.yaml's layout (rule ids, named errors, one-line sources, wrapped lines) changed no expectation.

    tests/fixtures/expectations_full.json holds ``Expected.to_json()`` (all but ``source``) and the unmet requirement
    of every cell of every combo, on both devices, computed by ``tests.outcomes.full_outcomes``. Only the cells it
    holds are compared: a new case's cells are additions, not changes, so adding a case touches no fixture. A change
    of matrix.yaml that changes an expectation on purpose regenerates it with REGENERATE and says why in its
    commit."""
    import json
    from pathlib import Path

    from fsdp_matrix.matrix import load_matrix
    from tests.outcomes import decode_full, full_outcomes

    before = decode_full(json.loads((Path(__file__).parent / "fixtures" / "expectations_full.json").read_text()))
    now = full_outcomes(load_matrix())
    assert sorted(now) == sorted(before), f"the combos changed: run `{REGENERATE}`"
    changed = [
        f"{column} {key}: {before[column][key]} -> {cells[key]}"
        for column, cells in now.items()
        for key in sorted(set(cells) & set(before[column]))
        if cells[key] != before[column][key]
    ]
    assert not changed, f"{len(changed)} cells changed, e.g. {changed[:3]}; if on purpose, run `{REGENERATE}`"


REGENERATE = "python -m tests.outcomes --full > tests/fixtures/expectations_full.json"
"""The one command that rewrites the expectations snapshot (named by its test's failure)."""


def test_expected_for_is_the_traces_first_match_on_every_cell_of_old_and_current():
    """expected_for stops at the first match without wording reasons; explain's trace words them all. They must
    agree (the full fixture above covers every combo through expected_for alone)."""
    from fsdp_matrix.cells import expand
    from fsdp_matrix.expectations import expected_for, trace
    from fsdp_matrix.matrix import load_matrix

    matrix = load_matrix()
    cases = {c.id: c for c in matrix.cases}
    for combo in ("old", "current"):
        versions = dict(matrix.combo(combo).pins)
        for cell in expand(matrix, device="cpu"):
            case = cases[cell.case]
            assert expected_for(case, cell, versions) == trace(case, cell, versions).expected, (combo, cell.id)


def test_judges_like_ignores_the_citation_only():
    rule = Expected("error", "ValueError", "shard", module="torch", rule=1, source="observed 2026-11-27")
    assert rule.judges_like(rule.to_json())
    assert rule.judges_like({**rule.to_json(), "source": "reworded", "rule": 4})
    assert not rule.judges_like({**rule.to_json(), "match": "shard:?"})
    assert not rule.judges_like({k: v for k, v in rule.to_json().items() if k != "module"})
    assert not rule.judges_like({"kind": "ok", "rule": 1, "source": "observed 2026-11-27"})
