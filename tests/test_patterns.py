"""``patterns``: every regex of matrix.yaml and every paste is matched with a time bound, and a rule whose regex
backtracks catastrophically is refused when the matrix is read, in one line naming its key."""

import copy

import pytest

from fsdp_matrix.errors import MatrixConfigError
from fsdp_matrix.matrix import parse_matrix
from tests.helpers import BASE

CATASTROPHIC = r"(\w|\w\w)+$"
"""Overlapping alternatives under a repeat: on a long run of word characters that does not end the text, every
backtracking engine (``re`` and ``regex`` alike) tries every split."""
NESTED = r"(\w+\s?)+QQQ"
"""Nested quantifiers: ``re`` tries every split of a long run of words without ``QQQ``."""


@pytest.mark.timeout(20, method="thread")
@pytest.mark.parametrize(
    "path,rule",
    [
        (("error", "match"), {"error": {"type": "ValueError", "match": CATASTROPHIC}}),
        (("hang", "stack"), {"hang": {"timeout_s": 8, "stack": CATASTROPHIC}}),
        (("warning", "match"), {"warning": {"type": "UserWarning", "match": CATASTROPHIC}}),
    ],
)
def test_validate_refuses_a_catastrophic_regex_in_one_line_naming_the_key(path, rule):
    data = copy.deepcopy(BASE)
    data["cases"][0]["expect"] = [dict(rule, source="s")]
    with pytest.raises(MatrixConfigError) as err:
        parse_matrix(data)
    message = str(err.value)
    assert f"cases[0](lora-requires-grad).expect[0].{path[0]}" in message and "backtrack" in message
    assert "\n" not in message


@pytest.mark.timeout(20, method="thread")
def test_a_search_past_its_bound_is_no_match_and_said_so(capsys):
    from fsdp_matrix import patterns

    text = "a" * 4000 + "!"
    assert patterns.search(CATASTROPHIC, text, timeout=0.2) is None
    assert "timed out" in capsys.readouterr().err
    assert patterns.search(r"a(!)", text).group(1) == "!"


@pytest.mark.timeout(20, method="thread")
def test_a_stack_regex_that_backtracks_is_bounded_where_the_harness_matches_it():
    """The regex is matched in the harness process against the dumped stacks: a loaded matrix refuses it, but a
    record's own Expected (read back, not validated) still must not hang the run."""
    from fsdp_matrix.expectations import Expected, stack_fits

    for pattern, stack in ((NESTED, "frame_in_run " * 40), (CATASTROPHIC, "a" * 4000 + "!")):
        assert stack_fits(Expected(kind="hang", match=pattern, timeout_s=8.0), [stack]) is False


@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("pattern", [r"(b|bb)+$", r"(xy|xyxy)+$"])
def test_defect14_a_pattern_is_probed_with_its_own_literal_characters(pattern):
    """``(b|bb)+$``: ``validate`` said ok (the fixed probe alphabet has no ``b``), and each triage search of a
    ``bbb...b!`` message then ran its full 2 s."""
    from fsdp_matrix import patterns

    assert "backtrack" in (patterns.check(pattern) or "")


def test_the_probes_refuse_no_rule_of_matrix_yaml():
    """The probes made of a pattern's own characters must not refuse a linear pattern: every rule of matrix.yaml."""
    from pathlib import Path

    import yaml

    from fsdp_matrix import patterns

    text = (Path(__file__).resolve().parents[1] / "matrix.yaml").read_text()
    found = [m for m in _matches(yaml.safe_load(text))]
    assert len(found) > 20 and [p for p in found if patterns.check(p)] == []


def _matches(node):
    """Every ``match`` and ``stack`` string under ``node``."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("match", "stack") and isinstance(value, str):
                yield value
            else:
                yield from _matches(value)
    elif isinstance(node, list):
        for value in node:
            yield from _matches(value)


def test_a_spent_budget_skips_every_search_and_says_so():
    from fsdp_matrix import patterns

    with patterns.budget(0.0) as spent:
        assert patterns.search("a", "a") is None and patterns.search("b", "b") is None
    assert (
        spent.line()
        == "the 0s budget for all regex searches ran out (2 searches of 2 patterns skipped, taken as no match)"
    )
    assert patterns.search("a", "a") is not None  # outside the budget, searched as before
