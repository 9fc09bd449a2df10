"""accelerate 1.11-1.12 pass ignored_params to fully_shard: https://github.com/huggingface/accelerate/issues/3923"""

from __future__ import annotations

import contextlib
from typing import Iterator, List

import torch.distributed.fsdp as fsdp_module

from fsdp_matrix.case import RankContext, main, peft_model, prepare_and_train, trainable_names

CASE = "accelerate-ignored-params"


@contextlib.contextmanager
def fully_shard_keywords() -> Iterator[List[str]]:
    """Record the keyword names of every ``torch.distributed.fsdp.fully_shard`` call made inside the block
    (accelerate imports it from there at call time); the call itself is unchanged."""
    seen: List[str] = []
    real = getattr(fsdp_module, "fully_shard", None)
    if real is None:  # this torch exports fully_shard only from torch.distributed._composable.fsdp
        yield seen
        return

    def spy(*args, **kwargs):
        seen.extend(k for k in kwargs if k not in seen)
        return real(*args, **kwargs)

    fsdp_module.fully_shard = spy
    try:
        yield seen
    finally:
        fsdp_module.fully_shard = real


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    params = {"adapter": "lora", "entry": "accelerate", "wrap": "fsdp2", **params}
    model = peft_model(params, ctx)
    trainable = trainable_names(model)
    with fully_shard_keywords() as keywords:
        # inspect runs once prepare, where accelerate calls fully_shard, has run, and before training
        return prepare_and_train(
            model, params, ctx, trainable, inspect=lambda _: {"fully_shard_keywords": sorted(keywords)}
        )


if __name__ == "__main__":
    main(run, CASE)
