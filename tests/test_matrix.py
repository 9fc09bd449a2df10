import copy

import pytest

from fsdp_matrix.errors import MatrixConfigError, UnknownCellError
from fsdp_matrix.matrix import load_matrix, parse_matrix
from tests.helpers import BAD_INPUTS, BASE, matrix_data, write_matrix


def test_valid_matrix_parses():
    m = parse_matrix(matrix_data())
    assert m.combo("current").pins.peft == "0.21.2"
    assert m.case("lora-requires-grad").expect[0].error.module == "torch.distributed.fsdp._flat_param"
    assert m.combo("current").requirements()[0] == "torch==2.13.0"


def _broken(path, value):
    data = copy.deepcopy(BASE)
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


@pytest.mark.parametrize(
    "path,value,expect",
    [
        (
            ("cases", 0, "expect", 0, "error", "match"),
            "(unbalanced",
            "cases[0](lora-requires-grad).expect[0].error.match: invalid regex",
        ),
        (
            ("cases", 0, "expect", 0, "versions"),
            {"torch": ">=2.x"},
            "cases[0](lora-requires-grad).expect[0].versions: invalid specifier for torch",
        ),
        (("cases", 0, "expect", 0, "versions"), {"pytorch": ">=2"}, "unknown package 'pytorch'"),
        (
            ("cases", 0, "expect", 3, "source"),
            KeyError,
            "cases[0](lora-requires-grad).expect[3].source: Field required",
        ),
        (("cases", 0, "expect", 3, "error"), {"type": "X", "match": "y"}, "needs exactly one of ok/error/skip"),
        (("combos", 0, "pins", "peft"), ">=0.13", "combos[0](current).pins.peft: not an exact version"),
        (("combos", 0, "pins", "torch"), KeyError, "combos[0](current).pins.torch: Field required"),
        (("cases", 0, "grids"), [], "cases[0](lora-requires-grad).grids"),
        (("cases", 0, "colour"), "red", "cases[0](lora-requires-grad).colour: Extra inputs are not permitted"),
        (("combos", 0, "sources"), {"torch": "git+https://github.com/pytorch/pytorch@main"}, "torch from source"),
        (("combos", 0, "sources"), {"peft": "--index-url=x"}, "combos[0](current).sources.peft"),
        (("combos", 0, "floating"), "main", "floating: main needs sources"),
        (("combos", 0, "floating"), "trunk", "combos[0](current).floating"),
    ],
)
def test_malformed_matrix_names_the_key_in_one_line(path, value, expect):
    with pytest.raises(MatrixConfigError) as err:
        parse_matrix(_broken(path, value))
    message = str(err.value)
    assert expect in message
    assert "\n" not in message
    assert message.startswith("matrix.yaml: ")


def test_a_combo_built_from_default_branches_parses():
    data = matrix_data()
    data["combos"][0].update(floating="main", sources={"peft": "git+https://github.com/huggingface/peft@main"})
    combo = parse_matrix(data).combo("current")
    assert combo.session == "main" and combo.sources["peft"].endswith("peft@main")


def test_duplicate_ids_rejected():
    data = matrix_data()
    data["combos"].append(copy.deepcopy(data["combos"][0]))
    with pytest.raises(MatrixConfigError, match="duplicate combos id 'current'"):
        parse_matrix(data)


def test_load_reports_yaml_errors_with_line(tmp_path):
    bad = tmp_path / "matrix.yaml"
    bad.write_text("combos:\n  - id: [unclosed\n")
    with pytest.raises(MatrixConfigError, match=r"matrix.yaml: line \d+: not valid YAML"):
        load_matrix(bad)


def test_unknown_ids():
    m = parse_matrix(matrix_data())
    with pytest.raises(UnknownCellError, match="no combo 'nope'"):
        m.combo("nope")
    with pytest.raises(UnknownCellError, match="no case 'nope'"):
        m.case("nope")


def test_repo_matrix_is_valid():
    m = load_matrix()
    assert {c.id for c in m.combos} >= {"current", "old"}


def test_newest_is_the_newest_cpu_combo():
    data = matrix_data()
    base = data["combos"][0]
    data["combos"] = [
        {**base, "id": "a", "pins": {**base["pins"], "peft": "0.9.0", "transformers": "9.0.0"}},
        {**base, "id": "b", "pins": {**base["pins"], "peft": "0.21.2", "transformers": "4.51.3"}},
        {**base, "id": "c", "pins": {**base["pins"], "peft": "0.21.2", "transformers": "5.23.0"}},
        {**base, "id": "d", "pins": {**base["pins"], "peft": "0.21.10", "transformers": "4.0.0"}, "tags": ["gpu"]},
    ]
    assert parse_matrix(data).newest("cpu").id == "c"
    assert load_matrix().newest("cpu").id == "current"


@pytest.mark.parametrize("defect", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_naming_the_key(tmp_path, defect):
    """Inputs that were accepted silently (or told in two lines)."""
    data, names = BAD_INPUTS[defect]
    with pytest.raises(MatrixConfigError) as err:
        load_matrix(write_matrix(tmp_path, data))
    message = str(err.value)
    assert names in message and "\n" not in message, message
    assert message.startswith(str(tmp_path / "matrix.yaml")) or message.startswith("matrix.yaml"), message


def test_known_axes_include_device_and_world_size_and_bools_match_ints(tmp_path):
    data = matrix_data()
    data["cases"][0]["expect"][0]["when"].update(device="cpu", world_size=2, orig=False)
    load_matrix(write_matrix(tmp_path, data))


AXES = {
    "adapter": {"meaning": "what PEFT adds", "values": ["lora"]},
    "dtype": {"meaning": "base dtype", "values": ["fp32", "bf16"]},
    "orig": {"meaning": "use_orig_params", "values": [0, 1]},
    "wrap": {"meaning": "how it is sharded", "values": ["decoder_layer", "fsdp2"]},
    "model": {"meaning": "tiny model", "values": ["llama"]},
}


def _with_axes(**changes):
    return matrix_data(axes=copy.deepcopy(AXES), **changes)


def test_declared_axes_accept_the_grids():
    assert parse_matrix(_with_axes()).axes["orig"].meaning == "use_orig_params"


@pytest.mark.parametrize(
    "change,line",
    [
        (
            lambda d: d["cases"][0]["grids"][0].update(wrap=["decoder_layr"]),
            "matrix.yaml: cases[0](lora-requires-grad).grids[0].wrap: unknown value 'decoder_layr' (axes.wrap has: "
            "'decoder_layer', 'fsdp2')",
        ),
        (
            lambda d: d["cases"][0]["grids"][0].update(knob=["a"]),
            "matrix.yaml: cases[0](lora-requires-grad).grids[0].knob: axis 'knob' is not declared (add it to axes: or "
            "the case's axes:)",
        ),
        (
            lambda d: d.update(
                platform={"skips": [{"id": "x", "when": {"wrap": "fsdp3"}, "reason": "r", "source": "s"}]}
            ),
            "matrix.yaml: platform.skips[0](x).when.wrap: unknown value 'fsdp3' (the axis has: 'decoder_layer', "
            "'fsdp2')",
        ),
        (
            lambda d: d["axes"].update(gc={"meaning": "two\nlines", "values": ["none"]}),
            "matrix.yaml: axes.gc.meaning: meaning must be one line",
        ),
    ],
)
def test_undeclared_axes_and_values_are_one_line_naming_the_key(change, line):
    data = _with_axes()
    change(data)
    with pytest.raises(MatrixConfigError) as err:
        parse_matrix(data)
    assert str(err.value) == line


def test_a_case_declares_its_own_axes():
    data = _with_axes()
    case = data["cases"][0]
    case["grids"][0]["knob"] = ["a", "b"]
    case["axes"] = {"knob": {"meaning": "a knob of this case only", "values": ["a", "b"]}}
    m = parse_matrix(data)
    assert m.case("lora-requires-grad").axes["knob"].values == ["a", "b"]
    case["grids"][0]["knob"] = ["c"]
    with pytest.raises(MatrixConfigError, match=r"grids\[0\].knob: unknown value 'c' \(axes.knob has: 'a', 'b'\)"):
        parse_matrix(data)


def test_the_repo_matrix_declares_every_axis_with_a_meaning():
    m = load_matrix()
    for case in m.cases:
        # world_size and nodes are built in (a grid's launch layout, fsdp_matrix.axes.LAYOUT_AXES), not declared
        used = {name for grid in case.grids for name in grid} - {"world_size", "nodes"}
        declared = {**m.axes, **case.axes}
        assert used <= set(declared) and all(axis.meaning for axis in declared.values()), case.id


def test_a_combos_cases_must_exist():
    data = copy.deepcopy(matrix_data())
    data["combos"][0]["cases"] = ["no-such-case"]
    with pytest.raises(MatrixConfigError, match=r"combos\[0\]\(current\)\.cases: unknown case 'no-such-case'"):
        parse_matrix(data)


def _named(**errors):
    data = matrix_data(errors=errors)
    data["cases"][0]["expect"][0]["error"] = "flatten"
    return data


def test_a_rule_names_an_error_of_the_errors_table():
    inline = parse_matrix(matrix_data()).case("lora-requires-grad").expect[0].error
    table = {"flatten": matrix_data()["cases"][0]["expect"][0]["error"]}
    named = parse_matrix(_named(**table)).case("lora-requires-grad").expect[0].error
    assert named == inline
    # the other rules keep their inline signatures
    assert parse_matrix(_named(**table)).case("lora-requires-grad").expect[1].error.match.startswith("FlatParameter")


def test_a_platform_signature_names_an_error_of_the_table():
    data = _named(flatten={"type": "ValueError", "match": "uniform"})
    data["platform"] = {"signatures": [{"id": "x", "errors": ["flatten"], "reason": "r", "source": "s"}]}
    assert parse_matrix(data).platform.signatures[0].errors[0].match == "uniform"


@pytest.mark.parametrize(
    "errors,line",
    [
        ({}, "matrix.yaml: cases[0](lora-requires-grad).expect[0].error: unknown error 'flatten' (errors: has none"),
        ({"other": {"type": "E", "match": "m"}}, "unknown error 'flatten' (errors: has other)"),
        ({"flatten": {"type": "E", "match": "(unbalanced"}}, "errors.flatten.match: invalid regex"),
        ({"flatten": {"type": "E", "match": "m"}, "Bad Name": {"type": "E", "match": "m"}}, "errors.Bad Name"),
    ],
)
def test_a_bad_error_name_is_one_line(errors, line):
    with pytest.raises(MatrixConfigError) as err:
        parse_matrix(_named(**errors))
    assert line in str(err.value) and "\n" not in str(err.value)


def test_rule_ids_are_unique_in_a_case():
    data = matrix_data()
    for rule in data["cases"][0]["expect"]:
        rule["id"] = "same"
    with pytest.raises(MatrixConfigError, match=r"expect\[1\].id: duplicate rule id 'same' \(expect\[0\] has it\)"):
        parse_matrix(data)
    data["cases"][0]["expect"][1]["id"] = "Bad Id"
    with pytest.raises(MatrixConfigError, match=r"expect\[1\]\(Bad Id\)\.id: String should match pattern"):
        parse_matrix(data)


def test_a_rule_id_is_case_slash_id():
    data = matrix_data()
    data["cases"][0]["expect"][0]["id"] = "flatten-error"
    case = parse_matrix(data).case("lora-requires-grad")
    assert case.rule_id(0) == "lora-requires-grad/flatten-error"
    assert case.rule_id(1) == f"lora-requires-grad/{case.expect[1].id}"  # derived (matrix.derived_rule_id)
    assert case.expect[1].id.startswith(("ok-", "error-", "skip-"))


def test_a_rule_without_an_id_gets_a_stable_derived_one():
    """The README's example rules carry no id, and "every rule has an id" failed a newcomer's case."""
    from fsdp_matrix.matrix import derived_rule_id

    data = matrix_data()
    rules = data["cases"][0]["expect"]
    for rule in rules:
        rule.pop("id", None)
    first = [r.id for r in parse_matrix(data).case("lora-requires-grad").expect]
    assert all(first) and len(set(first)) == len(first)
    data["cases"][0]["expect"] = list(reversed(rules))  # the same rules in another order keep their ids
    assert [r.id for r in parse_matrix(data).case("lora-requires-grad").expect] == list(reversed(first))
    rule = {"when": {"wrap": ["fsdp2", "decoder_layer"]}, "error": {"type": "ValueError"}, "source": "a"}
    same = {"source": "reworded", "error": {"type": "ValueError"}, "when": {"wrap": ["decoder_layer", "fsdp2"]}}
    assert derived_rule_id(rule) == derived_rule_id(same)
    assert derived_rule_id(rule).startswith("error-") and derived_rule_id({**rule, "versions": {"peft": "<1"}}) != (
        derived_rule_id(rule)
    )
    data["cases"][0]["expect"][0]["id"] = "written"  # a written id is kept
    assert parse_matrix(data).case("lora-requires-grad").expect[0].id == "written"
