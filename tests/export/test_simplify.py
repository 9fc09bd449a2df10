"""Tests for fsdp_matrix.export.simplify: constant locals and dead side-effect-free assignments."""

from __future__ import annotations

import textwrap

from fsdp_matrix.export.simplify import constant_args, pure_functions, simplify
from fsdp_matrix.export.tidy import drop_unused_keywords, tidy, unused_params


def _fn(text: str) -> str:
    return textwrap.dedent(text).strip()


def test_constant_local_folds_into_its_readers():
    text = _fn(
        """
        def f(model):
            orig = 1
            return wrap(model, None if orig is None else bool(orig))
        """
    )
    assert simplify(text, set()) == "def f(model):\n    return wrap(model, True)"


def test_dead_assignment_goes_only_when_side_effect_free():
    texts = {
        "names": "def names(model):\n    out = []\n    for n, p in model.named_parameters():\n        out.append(n)\n"
        "    return sorted(out)",
        "saves": "def saves(model):\n    model.save('x')\n    return 1",
    }
    pure = pure_functions(texts)
    assert pure == {"names"}
    text = _fn(
        """
        def f(model):
            # what it was
            seen = names(model)
            kept = saves(model)
            go(model)
            return 1
        """
    )
    out = simplify(text, pure)
    assert "seen" not in out and "what it was" not in out and "kept = saves(model)" in out


def test_the_statement_before_a_raise_stays():
    text = _fn(
        """
        def f(model):
            x = names(model)
            raise RuntimeError('not reproduced')
        """
    )
    assert "x = names(model)" in simplify(text, {"names"})


def test_a_parameter_every_caller_passes_as_the_same_constant_folds():
    texts = {
        "outer": "def outer(model):\n    return inner(model, 'decoder_layer', orig=False)",
        "inner": "def inner(model, wrap, orig=True):\n    if wrap == 'fsdp2':\n        return 2\n"
        "    return fsdp(model, use_orig_params=bool(orig))",
        "other": "def other(model):\n    return inner(model, 'decoder_layer', orig=True)",
    }
    args = constant_args(texts)
    assert args["inner"] == {"wrap": "decoder_layer"}  # orig differs between the callers: not folded
    out = simplify(texts["inner"], set(), args["inner"])
    assert out == "def inner(model, wrap, orig=True):\n    return fsdp(model, use_orig_params=bool(orig))"


def test_a_call_inside_an_f_string_is_not_replaced_by_an_expression_whose_quotes_would_close_it():
    from fsdp_matrix.export.inliner import inline_expressions

    texts = {
        "name": 'def name(d):\n    return str(d).replace("torch.", "")',
        "use": 'def use(d):\n    return f"{name(d)} wide"',
    }
    out = inline_expressions(texts)
    compile(out["use"], "use", "exec")
    assert out["use"] == texts["use"]


def test_an_argument_the_callee_never_reads_is_dropped_and_its_value_goes_dead():
    texts = {
        "train": "def train(model, ctx, steps=3, trainable=None, *, reference=None):\n    return model(ctx)",
        "names": "def names(model):\n    return sorted(n for n, _ in model.named_parameters())",
        "save": "def save(model):\n    model.save('x')\n    return 1",
    }
    pure = pure_functions(texts)
    assert unused_params(texts) == {"train": {"steps", "trainable", "reference"}}
    text = _fn(
        """
        def f(model, ctx):
            trainable = names(model)
            return train(model, ctx, trainable=trainable, reference=save(model))
        """
    )
    # a value with a side effect is still computed: only a side-effect-free one is left out
    out = simplify(drop_unused_keywords(text, unused_params(texts), pure), pure)
    assert out == "def f(model, ctx):\n    return train(model, ctx, reference=save(model))"


def test_rewrites_that_change_nothing_a_run_does():
    text = _fn(
        """
        def f(model, ctx):
            kwargs = {}
            opt = None or make(model)
            with contextlib.nullcontext([]):
                out = wrap(model, device=ctx.device,
                    **{})
            go(model, **kwargs)
            return None
        """
    )
    assert tidy(text) == _fn(
        """
        def f(model, ctx):
            opt = make(model)
            out = wrap(model, device=ctx.device)
            go(model)
        """
    )


def test_a_fresh_object_is_pure_and_the_global_rng_is_not():
    texts = {
        "batch": "def batch(seed):\n    gen = torch.Generator().manual_seed(seed)\n"
        "    return torch.randint(0, 9, (2,), generator=gen).to('cpu')",
        "noise": "def noise():\n    return torch.randint(0, 9, (2,))",
        "seed": "def seed():\n    torch.manual_seed(0)\n    return 1",
    }
    assert pure_functions(texts) == {"batch"}


def test_a_counter_keeps_its_first_value():
    text = _fn(
        """
        def f(model):
            count = 0
            for m in model.modules():
                count += 1
            go(model)
            return 1
        """
    )
    assert "count = 0" in simplify(text, set())
