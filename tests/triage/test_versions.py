"""``triage.versions``: answers true to the versions: the observed range, "fixed in" that never contradicts its rule,
and workarounds that are the matched rule's own cells, filtered by what the user's release has."""

from pathlib import Path

import pytest

from fsdp_matrix.expectations import version_matches
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.triage import cli as triage_cli
from fsdp_matrix.triage.versions import fixed_in, observed_range, workarounds

ROOT = Path(__file__).resolve().parents[2]
MATRIX = load_matrix(ROOT / "matrix.yaml", check_repros=False)
CASES = {c.id: c for c in MATRIX.cases}
# the peft 0.3.0 / torch 2.0.1 paste of huggingface/accelerate#1620
OLD_PASTE = ROOT / "tests" / "fixtures" / "triage" / "corpus" / "accelerate1620_peft030_torch201.txt"


def test_versions_older_than_every_combo_say_so_and_offer_nothing(capsys):
    code = triage_cli.main([str(OLD_PASTE), "--versions", "peft=0.3.0,torch=2.0.1"])
    out = capsys.readouterr().out
    assert code == 0 and "1. mixed-dtype" in out
    assert "peft 0.3.0 is older than every combo observed (oldest: peft 0.10.0); nothing here is known for it" in out
    assert "workarounds expected to hold" not in out and "workarounds: none offered" in out
    assert "autocast" not in out.split("workarounds:", 1)[1]  # get_peft_model has no autocast_adapter_dtype there
    assert "yours are in range" not in out and "cells expected to raise it on your versions" not in out


def test_versions_inside_the_range_are_not_flagged():
    assert observed_range(MATRIX, {"peft": "0.13.2", "torch": "2.13.0"}) == []
    assert observed_range(MATRIX, {"peft": "0.3.0"})[0].startswith("peft 0.3.0 is older than every combo observed")


RULES = [(c.id, i) for c in MATRIX.cases for i, r in enumerate(c.expect) if r.error is not None]


@pytest.mark.parametrize("case_id,index", RULES, ids=[f"{c}[{i}]" for c, i in RULES])
def test_fixed_in_never_contradicts_its_rule(case_id, index):
    rule = CASES[case_id].expect[index]
    fixed = fixed_in(MATRIX, CASES[case_id], index)
    specs = dict(rule.versions or {})
    for package, version in fixed.versions.items():
        assert not version_matches(specs[package], version), (fixed.text, specs)
    upper = any(s.split(",")[-1].lstrip().startswith("<") or "<" in s for s in specs.values())
    assert fixed.text.startswith("no release") is (not fixed.versions), fixed.text
    if upper:
        assert fixed.versions, fixed.text  # a rule with an upper bound is fixed past it


def test_workarounds_are_the_matched_rule_s_cells_with_one_setting_changed():
    case = CASES["mixed-dtype"]
    integer = next(i for i, r in enumerate(case.expect) if r.error and "integer" in r.error.match)
    current = next(c for c in MATRIX.combos if c.id == "current").pins.model_dump()
    changes = {w.change.split("=")[0] for w in workarounds(MATRIX, case, integer, current)}
    assert changes and changes <= set(case.expect[integer].when) - {"adapter"}  # e.g. storage=bf16, never lora


@pytest.mark.parametrize("peft,offered", [("0.11.1", False), ("0.13.2", True)])
def test_a_workaround_the_release_lacks_is_not_offered(peft, offered):
    case = CASES["mixed-dtype"]
    upcast = next(i for i, r in enumerate(case.expect) if r.error and "float32" in r.error.match)
    found = workarounds(MATRIX, case, upcast, {"peft": peft, "torch": "2.13.0", "transformers": "4.57.6"})
    assert any(w.change == "autocast=0" for w in found) is offered


def test_a_patch_release_below_the_oldest_combo_is_known_as_its_minor():
    """torch 2.4.0 under a matrix whose oldest torch is 2.4.1 was "older than every combo": nothing offered."""
    from packaging.version import Version

    oldest = {
        p: min(Version(getattr(c.pins, p)) for c in MATRIX.combos if getattr(c.pins, p, None))
        for p in ("torch", "peft", "transformers", "accelerate")
    }
    package, pin = next((p, v) for p, v in oldest.items() if v.micro > 0)
    below = f"{pin.major}.{pin.minor}.{pin.micro - 1}"
    [line] = observed_range(MATRIX, {package: below})
    assert "older than every combo" not in line and f"earlier patch of the oldest combo's {package} {pin}" in line
    assert "older than every combo" in observed_range(MATRIX, {package: f"{pin.major}.{pin.minor - 1}.0"})[0]


def test_a_rule_the_stated_release_cannot_raise_is_named():
    from fsdp_matrix.triage.versions import cannot_raise

    upcast = CASES["mixed-dtype"].expect[6]  # autocast_adapter_dtype=True: PEFT >= 0.12 only
    assert cannot_raise(MATRIX, upcast, {"peft": "0.10.0"})
    assert cannot_raise(MATRIX, upcast, {"peft": "0.13.2"}) is None
    assert cannot_raise(MATRIX, upcast, {}) is None  # nothing stated: nothing known
    ranged = CASES["trl-qlora-upcast"].expect[0]  # trl <0.29
    assert cannot_raise(MATRIX, ranged, {"trl": "0.30.0"}) and cannot_raise(MATRIX, ranged, {"trl": "0.8.6"}) is None


def test_of_two_cases_with_one_message_the_one_the_stated_versions_can_raise_is_first():
    from fsdp_matrix.triage.match import claims, match
    from fsdp_matrix.triage.parse import parse

    text = (
        "QLoRA with FSDP fails at once\n"
        "ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.float32\n"
    )
    first = [m.case.id for m in claims(match(MATRIX, parse(text)))]
    assert first[:2] == ["mixed-dtype", "trl-qlora-upcast"]  # PEFT's upcast is the case's own report: first
    stated = [m.case.id for m in claims(match(MATRIX, parse("peft==0.10.0\n" + text)))]
    assert stated[:2] == ["trl-qlora-upcast", "mixed-dtype"]  # PEFT 0.10 has no upcast: TRL's is first


def test_a_change_that_trains_only_with_other_settings_names_them_too():
    """mixed-dtype's uint8 QLoRA error (expect[2]): storage=bf16 alone meets the uniform-dtype error under autocast=1
    with decoder_layer wrapping; it trains with autocast=0 (expect 'autocast0-ok') or with PEFT's policy. 'what works'
    said 'set storage=bf16' alone (the Soup recipe report's own table shows bf16 storage alone failing)."""
    case = CASES["mixed-dtype"]
    integer = next(i for i, r in enumerate(case.expect) if r.id == "qlora-uint8-decoder_layer+peft_policy-error")
    versions = {"peft": "0.20.0", "torch": "2.13.0", "transformers": "4.57.6", "bitsandbytes": "0.50.0"}
    found = workarounds(MATRIX, case, integer, versions)
    by_rule = {case.expect[w.rule].id: w for w in found if w.change == "storage=bf16"}
    assert by_rule["autocast0-ok"].together == ["autocast=0"]
    assert by_rule["peft_policy-ok"].together == ["wrap=peft_policy"]
    # a change that trains on every cell it reaches needs nothing else
    assert all(not w.together for w in found if w.change != "storage=bf16") or not found
    offered = triage_cli._workarounds(MATRIX, _claimed(case), versions, None, [], [])[1]
    lines = triage_cli.what_works(offered, "your versions", None, versions)
    assert "set storage=bf16 with autocast=0 (trains on your versions" in lines[0]


def _claimed(case):
    from fsdp_matrix.triage.match import CaseMatch, Hit, Signature

    index = next(i for i, r in enumerate(case.expect) if r.id == "qlora-uint8-decoder_layer+peft_policy-error")
    sig = Signature(case.id, f"expect[{index}]", case.expect[index])
    return CaseMatch(case, [Hit(sig, 5.0, [], 5.0, [], None, "exact")])
