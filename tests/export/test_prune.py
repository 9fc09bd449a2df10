"""Tests for fsdp_matrix.export.prune: params folding, branch pruning, traced lines, reachability, imports."""

from __future__ import annotations

import ast
import textwrap

from fsdp_matrix.export.layout import NOT_REPRODUCED, RAISED_HERE
from fsdp_matrix.export.prune import Trace, prune_body, prune_imports

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
    # axis(params, "model") and params["wrap"] fold to the cell's values; what is left inlines into run()
    assert "'gemma'" in text and "'peft_policy'" in text and "params[" not in text and "axis(" not in text
    assert "fsdp2" not in text and "mixed" not in text and "UNUSED" not in text and "WRAPS" not in text
    assert "if " not in text and "bf16" not in text  # the branches of other axis values are gone
    assert pruned.kept == ["run"]


def test_helper_not_called_with_params_stays_opaque_and_kept():
    script = SCRIPT.replace(
        'build(axis(params, "model", default="llama"), params.get("dtype", "fp32"))',
        'build(axis(ctx, "model"), axis(ctx, "dtype"))',
    )
    pruned = prune_body(script, _body(script), ["run"], PARAMS)
    assert 'axis(ctx, "model")' in pruned.text and 'axis(ctx, "dtype")' in pruned.text
    assert "axis" in pruned.kept and "raise ValueError(name)" in pruned.text


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
    assert "step = 'gemma'.upper()" + RAISED_HERE in text and NOT_REPRODUCED in text
    # never ran: gone, and the stop line says so if the statement above does not raise
    assert "loss" not in text and "bf16" not in text


def test_a_statement_that_raised_in_one_call_but_completed_in_another_gets_no_stop():
    # CI, dora-sharded-weight on old: forward_logits ran once before wrapping (fine) and raised after; a stop
    # after its forward made the first call raise "not reproduced" and the export judged DIFFERENT-ERROR
    lines = {
        _line(SCRIPT, 'kind = params["wrap"]'),
        _line(SCRIPT, 'if params["wrap"] == "fsdp2"'),
        _line(SCRIPT, 'elif "mp" in params'),
        _line(SCRIPT, "model = build("),
        _line(SCRIPT, 'if dtype == "bf16"'),
        SCRIPT.splitlines().index("    return name") + 1,
        _line(SCRIPT, "return train(model, kind)"),
        _line(SCRIPT, "step = model.upper()"),
        _line(SCRIPT, "if kind:"),
        _line(SCRIPT, "loss = step + kind"),
        _line(SCRIPT, 'return {"loss": loss}'),
    }
    raised = [[_line(SCRIPT, "return train(model, kind)"), _line(SCRIPT, "step = model.upper()")]]
    text = prune_body(SCRIPT, _body(SCRIPT), ["run"], PARAMS, Trace(lines, raised)).text
    ast.parse(text)
    assert "step = 'gemma'.upper()" + RAISED_HERE in text and NOT_REPRODUCED not in text
    assert "loss = step + 'peft_policy'" in text or "loss = step + kind" in text, text


def test_imports_nothing_reads_are_dropped():
    assert prune_imports(["from __future__ import annotations", "import os", "from a import b, c as d"], {"d"}) == [
        "from __future__ import annotations",
        "from a import c as d",
    ]


def test_a_helper_default_is_its_default_parameter_never_the_next_argument():
    script = textwrap.dedent(
        """
        def axis(params, name, choices, default=None):
            return params.get(name, default)


        def run(params: dict, ctx):
            return use(axis(params, "shard", "abc", default="full"), axis(params, "mp", "xyz"), axis(params, "k", "ab"))
        """
    ).lstrip()
    text = prune_body(script, (1, len(script.splitlines())), ["run"], {"k": "a"}).text
    assert (
        "use('full', axis(params, 'mp', 'xyz'), 'a')" in text
        or "use('full', axis(params, \"mp\", \"xyz\"), 'a')" in text
    )
