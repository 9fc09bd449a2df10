"""Tests for fsdp_matrix.export.prune: params folding, branch pruning, traced lines, reachability, imports."""

from __future__ import annotations

import ast
import textwrap

from fsdp_matrix.export.prune import NOT_REPRODUCED, RAISED_HERE, Trace, prune_body, prune_imports

SCRIPT = textwrap.dedent(
    '''
    import os

    WRAPS = ("a", "b")
    UNUSED = 3


    def axis(params, name, default=None):
        """An opaque helper: kept, its calls folded."""
        value = params.get(name, default)
        if value is None:
            raise ValueError(name)
        return value


    def run(params: dict, ctx) -> dict:
        """Docstring dropped."""
        kind = params["wrap"]
        # the comment above a kept statement stays
        if params["wrap"] == "fsdp2":
            return fsdp2()
        elif "mp" in params:
            return mixed()
        else:
            model = build(axis(params, "model", default="llama"), params.get("dtype", "fp32"))
        return train(model, kind)


    def fsdp2():
        return "never reached"


    def mixed():
        return "never reached either"


    def build(name, dtype):
        if dtype == "bf16":
            return name + "!"
        return name


    def train(model, kind):
        step = model.upper()
        if kind:
            loss = step + kind
        else:
            loss = None
        return {"loss": loss}
    '''
).lstrip()
PARAMS = {"wrap": "peft_policy", "model": "gemma"}


def _body(text: str):
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines, 1) if line.startswith("WRAPS"))
    return first, len(lines)


def _line(text: str, snippet: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if snippet in line)


def test_params_fold_and_other_axis_values_go():
    pruned = prune_body(SCRIPT, _body(SCRIPT), ["run"], PARAMS)
    text = pruned.text
    ast.parse(text)
    assert "kind = 'peft_policy'" not in text and "train(model, 'peft_policy')" in text  # a constant local folds
    assert "build('gemma', 'fp32')" in text  # axis(params, "model") and params.get fold to the cell's values
    assert "fsdp2" not in text and "mixed" not in text and "UNUSED" not in text and "WRAPS" not in text
    assert "if " not in text.split("def run")[1].split("def ")[0]  # the else branch runs unconditionally
    assert "# the comment above a kept statement stays" in text and "Docstring dropped" not in text
    assert pruned.kept[0] == "run" and "axis" not in pruned.kept


def test_helper_not_called_with_params_stays_opaque_and_kept():
    script = SCRIPT.replace('axis(params, "model", default="llama")', 'axis(ctx, "model")')
    text = prune_body(script, _body(script), ["run"], PARAMS).text
    assert "axis(ctx, 'model')" in text or 'axis(ctx, "model")' in text
    assert "def axis(" in text and "raise ValueError(" in text


def test_a_trace_keeps_what_ran_and_stops_after_the_raise():
    lines = {
        _line(SCRIPT, 'kind = params["wrap"]'),
        _line(SCRIPT, 'if params["wrap"] == "fsdp2"'),
        _line(SCRIPT, 'elif "mp" in params'),
        _line(SCRIPT, "model = build("),
        _line(SCRIPT, 'if dtype == "bf16"'),
        SCRIPT.splitlines().index("    return name") + 1,
        _line(SCRIPT, "return train(model, kind)"),
        _line(SCRIPT, "step = model.upper()"),
    }
    raised = [[_line(SCRIPT, "return train(model, kind)"), _line(SCRIPT, "step = model.upper()")]]
    text = prune_body(SCRIPT, _body(SCRIPT), ["run"], PARAMS, Trace(lines, raised)).text
    ast.parse(text)
    train = text.split("def train")[1]
    assert "step = model.upper()" + RAISED_HERE in train and NOT_REPRODUCED in train
    assert "loss" not in train  # never ran: gone, and the stop line says so if the statement above does not raise
    build = text.split("def build")[1].split("def ")[0]
    assert 'if dtype == "bf16"' not in build and "return 'gemma'" in build  # every caller passes the same name


def test_imports_nothing_reads_are_dropped():
    assert prune_imports(["from __future__ import annotations", "import os", "from a import b, c as d"], {"d"}) == [
        "from __future__ import annotations",
        "from a import c as d",
    ]
