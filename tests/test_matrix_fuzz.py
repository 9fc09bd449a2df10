"""Fuzzing: malformed matrix documents end in MatrixConfigError with one line, never another exception.

Hypothesis mutates the valid test matrix (replaces a node anywhere with junk, drops or adds keys) and writes random
YAML text. A document that is accepted must give cells that every command can address: unique keys that
``find_cell`` resolves, with no ``/`` or whitespace in a cell id. ``pytest.mark.timeout`` guards against a hang;
nothing here asserts speed. FSDP_MATRIX_FUZZ_EXAMPLES sets how many examples each test tries (default 300).
"""

from __future__ import annotations

import copy
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdp_matrix.cells import expand, find_cell
from fsdp_matrix.errors import MatrixConfigError
from fsdp_matrix.matrix import Matrix, load_matrix, parse_matrix
from tests.helpers import matrix_data, write_matrix

FUZZ = settings(
    max_examples=int(os.environ.get("FSDP_MATRIX_FUZZ_EXAMPLES", "300")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "/", "a/b", "../x", "-e /etc", "x\ny", " ", "lora", "fsdp2", ">=2.1", "<", "==", "1", "*"]),
)
junk = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)


def _mutate(data: st.DataObject, doc):
    """Replace one node of ``doc`` (reached by a random walk) with junk, drop a key, or add one."""
    parent, key = None, None
    node = doc
    while isinstance(node, (dict, list)) and node and data.draw(st.booleans(), label="descend"):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        parent, key = node, data.draw(st.sampled_from(keys), label="key")
        node = node[key]
    action = data.draw(st.sampled_from(["replace", "drop", "add"]), label="action")
    if parent is None:
        return data.draw(junk, label="whole") if action == "replace" else doc
    if action == "replace":
        parent[key] = data.draw(junk, label="value")
    elif action == "drop" and isinstance(parent, dict):
        del parent[key]
    elif action == "drop":
        parent.pop(key)
    elif isinstance(parent[key], dict):
        parent[key][data.draw(st.text(max_size=8), label="new key")] = data.draw(junk, label="new value")
    elif isinstance(parent[key], list):
        parent[key].append(data.draw(junk, label="new item"))
    return doc


def _accepted_is_addressable(matrix: Matrix) -> None:
    for device in ("cpu", "cuda"):
        cells = expand(matrix, device)
        keys = [c.key for c in cells]
        assert len(keys) == len(set(keys))
        for cell in cells:
            assert "/" not in cell.id and not any(ch.isspace() for ch in cell.id), cell.id
            assert find_cell(matrix, cell.key, device) == cell


def _one_line(exc: MatrixConfigError) -> None:
    text = str(exc)
    assert text and "\n" not in text and text.startswith("matrix.yaml"), text


@pytest.mark.timeout(600)
@FUZZ
@given(st.data())
def test_mutated_documents_are_accepted_and_addressable_or_one_line(data):
    doc = _mutate(data, copy.deepcopy(matrix_data()))
    for _ in range(data.draw(st.integers(0, 2), label="more mutations")):
        doc = _mutate(data, doc)
    try:
        matrix = parse_matrix(doc)
    except MatrixConfigError as exc:
        _one_line(exc)
    else:
        _accepted_is_addressable(matrix)


@pytest.mark.timeout(600)
@FUZZ
@given(
    st.lists(
        st.sampled_from(
            [
                "combos",
                "cases",
                "grids",
                "axes",
                "platform",
                "when",
                "-",
                ":",
                " ",
                "\n",
                "  ",
                "&a",
                "*a",
                "<<",
                "[",
                "]",
                "{",
                "}",
                ",",
                "'",
                '"',
                "x",
                "1",
                "!!python/name:os.system",
                "\t",
                "?",
                "|",
                ">",
                "\x00",
                "\x07",
                "\ufeff",
                "\u2028",
            ]
        ),
        max_size=40,
    ).map("".join)
)
def test_random_yaml_text_is_one_line(tmp_path_factory, text):
    path = write_matrix(tmp_path_factory.mktemp("m"), matrix_data())
    path.write_text(text)
    try:
        load_matrix(path)
    except MatrixConfigError as exc:
        assert str(exc) and "\n" not in str(exc), str(exc)
