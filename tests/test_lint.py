import copy

from fsdp_matrix.cli import main
from fsdp_matrix.lint import lint
from fsdp_matrix.matrix import load_matrix, parse_matrix
from tests.helpers import matrix_data
from tests.test_expectations import PLATFORM


def _lines(data):
    return [f.line() for f in lint(parse_matrix(data))]


def test_the_repo_matrix_has_no_dead_or_duplicated_rule():
    assert [f.line() for f in lint(load_matrix())] == []


def test_a_case_rule_copying_a_platform_skip_is_reported():
    data = matrix_data(platform=PLATFORM)
    copy_of_skip = {
        "when": {"wrap": "fsdp2", "device": "cpu"},
        "versions": {"torch": "<2.6"},
        "skip": "FSDP2 has no CPU path",
        "source": "copied",
    }
    data["cases"][0]["expect"].insert(0, copy_of_skip)
    assert _lines(data) == [
        "cases[0](lora-requires-grad).expect[0]: duplicates platform.skips[0](fsdp2-no-cpu): it selects every cell "
        "of this rule first; delete one"
    ]


def test_a_case_rule_expecting_a_platform_signature_is_reported():
    data = matrix_data(platform=PLATFORM)
    data["cases"][0]["expect"].insert(
        0,
        {"when": {"wrap": "fsdp2"}, "error": {"type": "AttributeError", "match": "record_event"}, "source": "copied"},
    )
    assert _lines(data)[0].startswith("cases[0](lora-requires-grad).expect[0]: duplicates platform.signatures[0]")


def test_a_when_that_selects_no_cell_is_reported():
    data = matrix_data()
    # each value exists, but no cell has orig 1 together with fsdp2
    data["cases"][0]["expect"].insert(0, {"when": {"orig": 1, "wrap": "fsdp2"}, "ok": True, "source": "s"})
    assert _lines(data) == [
        "cases[0](lora-requires-grad).expect[0]: when {'orig': 1, 'wrap': 'fsdp2'} selects no cell of the case"
    ]


def test_a_rule_shadowed_by_an_earlier_one_is_reported():
    data = matrix_data()
    expect = data["cases"][0]["expect"]
    expect.insert(3, {"when": {"wrap": "fsdp2"}, "versions": {"peft": "<0.11"}, "ok": True, "source": "s"})
    # rule 2 (peft < 0.11, any cell: skip) selects every cell rule 3 selects, for every env rule 3 names
    assert _lines(data) == [
        "cases[0](lora-requires-grad).expect[3]: is shadowed by expect[2]: it selects every cell of this rule first; "
        "delete one"
    ]


def test_a_rule_that_never_decides_on_any_combo_is_reported():
    data = matrix_data()
    expect = data["cases"][0]["expect"]
    # holds on combo current (torch 2.13), but the broad torch >= 2.1 rule above always wins there
    expect.insert(
        1, {"when": {"wrap": "decoder_layer", "orig": 0}, "versions": {"torch": ">=2.5"}, "ok": True, "source": "s"}
    )
    assert _lines(data) == [
        "cases[0](lora-requires-grad).expect[1]: never decides a cell on any combo: where it holds (2 cell(s)), an "
        "earlier rule wins"
    ]


def test_a_platform_alternative_that_selects_no_cell_is_reported():
    platform = copy.deepcopy(PLATFORM)
    platform["skips"][0]["when"] = [{"wrap": "fsdp2"}, {"wrap": "fsdp2", "orig": 1}]
    assert _lines(matrix_data(platform=platform)) == [
        "platform.skips[0](fsdp2-no-cpu).when[1]: selects no cell of any case"
    ]


def test_validate_exits_non_zero_with_one_line_per_finding(tmp_path, capsys):
    import yaml

    data = matrix_data()
    data["cases"][0]["expect"].insert(0, {"when": {"orig": 1, "wrap": "fsdp2"}, "ok": True, "source": "s"})
    (tmp_path / "repros").mkdir()
    (tmp_path / "repros" / "lora_requires_grad.py").write_text("")
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    assert main(["validate", str(tmp_path / "m.yaml")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "fsdp_matrix validate: cases[0](lora-requires-grad).expect[0]: when {'orig': 1, 'wrap': 'fsdp2'} selects no "
        "cell of the case"
    ]


def test_versions_no_release_satisfies_are_reported():
    from fsdp_matrix.lint import empty_specifier

    assert empty_specifier(">=0.14,<0.13") and empty_specifier("<2.7,>2.7") and empty_specifier("==1.0,!=1.0")
    assert not any(empty_specifier(s) for s in ("<2.7", ">=0.12,<0.14", "==0.13.0", ">=2.6,<2.8", "==2.*", "<0.1"))
    data = matrix_data()
    data["cases"][0]["expect"][2]["versions"] = {"peft": ">=0.14,<0.13"}
    assert "cases[0](lora-requires-grad).expect[2].versions.peft: '>=0.14,<0.13' admits no release" in _lines(data)[0]
