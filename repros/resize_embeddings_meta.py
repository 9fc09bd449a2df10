"""resize_token_embeddings with ranks > 0 on meta: https://github.com/huggingface/transformers/issues/40382"""

from __future__ import annotations

import inspect

from fsdp_matrix.case import (
    DTYPES,
    MODELS,
    VOCAB,
    RankContext,
    add_adapter,
    axis,
    build_model,
    build_rank0_model,
    flag,
    init_of,
    main,
    on_every_rank,
    wrap_and_train,
)

CASE = "resize-embeddings-meta"
NEW_TOKENS = 8
"""Tokens added, as a tokenizer with new special tokens would."""


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    name, dtype = axis(params, "model", MODELS), axis(params, "dtype", tuple(DTYPES), default="fp32")
    if init_of(params) == "ram_efficient":
        base = build_rank0_model(name, dtype, ctx)
    else:
        base = build_model(name, dtype, ctx)
    mean = flag(params, "mean")
    # before transformers 4.46 there is no mean resizing: mean 0 is then the plain call; mean 1 raises its TypeError
    takes = "mean_resizing" in inspect.signature(base.resize_token_embeddings).parameters
    kwargs = {"mean_resizing": mean} if takes or mean else {}
    # only ranks > 0 hold meta rows: every rank stops if one fails, so none walks into FSDP's collectives alone
    on_every_rank(lambda: base.resize_token_embeddings(VOCAB + NEW_TOKENS, **kwargs))
    model = add_adapter(base, "lora", ctx.seed, autocast=False)
    checks = wrap_and_train(model, params, ctx)
    return {"vocab": VOCAB + NEW_TOKENS, **checks}


if __name__ == "__main__":
    main(run, CASE)
