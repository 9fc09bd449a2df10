import pytest

from fsdp_matrix.workload.params import UnknownAxisValue, axis, flag


def test_axis_returns_the_matching_choice_and_the_default_when_absent():
    assert axis({"wrap": "fsdp2"}, "wrap", ("decoder_layer", "fsdp2")) == "fsdp2"
    assert axis({}, "dtype", ("fp32", "bf16"), default="fp32") == "fp32"
    assert axis({"orig": True}, "orig", (0, 1)) == 1  # YAML's true and 1 are one value


def test_axis_refuses_an_unknown_value_naming_axis_value_and_choices():
    with pytest.raises(UnknownAxisValue, match=r"axis 'wrap': unknown value 'root' \(this repro takes: 'fsdp2'\)"):
        axis({"wrap": "root"}, "wrap", ("fsdp2",))
    with pytest.raises(UnknownAxisValue, match="axis 'gc' missing"):
        axis({}, "gc", ("none",))
    assert issubclass(UnknownAxisValue, ValueError)  # an unknown value is the repro's ValueError, as before


def test_flag_is_a_bool_or_the_default():
    assert flag({"orig": 1}, "orig") is True
    assert flag({"orig": False}, "orig") is False
    assert flag({}, "orig", default=None) is None
    with pytest.raises(UnknownAxisValue):
        flag({"orig": 2}, "orig")


def test_the_helper_imports_only_the_standard_library():
    # exported scripts inline it, and standalone runs have no matrix.yaml at rank time
    import ast
    import inspect

    import fsdp_matrix.workload.params as module

    tree = ast.parse(inspect.getsource(module))
    imported = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    assert imported <= {"__future__", "typing"}


def test_repros_read_params_only_through_the_helper():
    import re
    from pathlib import Path

    repros = Path(__file__).resolve().parents[2] / "repros"
    direct = [
        f"{p.name}:{i}"
        for p in sorted(repros.glob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"params(\[|\.get\()", line)
    ]
    # README "Adding a case" states the rule: axis()/flag() refuse, in one line, a value the repro does not handle
    assert direct == [], f"read these params through axis(params, NAME, CHOICES) or flag(params, NAME): {direct}"
