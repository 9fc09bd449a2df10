"""Tests for fsdp_matrix.export.fold: a cell's params folded into constants."""

from __future__ import annotations

import ast
import textwrap

from fsdp_matrix.export.fold import Folder

TEXT = textwrap.dedent(
    """
    def run(params: dict, ctx):
        base.config.use_cache = flag(params, "cache")
        kind = axis(params, "wrap")
        raw = params.get("cache")
    """
).lstrip()


def test_flag_folds_to_a_bool_and_axis_to_the_value_as_written():
    folder = Folder(ast.parse(TEXT), {"cache": 1, "wrap": "fsdp2"})
    out = "\n".join(folder.apply(TEXT.splitlines()))
    # transformers' strict configs refuse use_cache = 1 (survey: gradient-checkpointing's export, REGRESSION alone)
    assert "base.config.use_cache = True" in out
    assert "kind = 'fsdp2'" in out and "raw = 1" in out
