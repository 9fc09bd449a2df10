"""peft PR #2151, transformers#40382: ``resize_token_embeddings`` with mean resizing on a model whose ranks > 0 hold
meta weights (ram-efficient loading), before PEFT and FSDP.

transformers 4.46 made ``mean_resizing=True`` the default: the new rows are drawn from the mean and covariance of the
old ones. On ranks > 0 under ram-efficient loading the old rows are meta tensors. PEFT's FSDP QLoRA example script
(PR #2151) passes ``mean_resizing=False`` when it finds the embedding on meta; transformers#40382 reports the same
error from ``accelerate launch`` with ``fsdp_cpu_ram_efficient_loading: true``.

Axes: ``init`` (``full``: the control), ``mean`` (``mean_resizing``: 1, the default since transformers 4.46, or 0,
PEFT's workaround; a transformers without the argument takes neither and raises its TypeError), ``wrap``/``orig``/
``entry`` as everywhere. The resized model gets the usual LoRA and trains with every check; the new rows arrive on
ranks > 0 through FSDP's broadcast from rank 0.
"""

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
