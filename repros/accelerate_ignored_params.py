"""accelerate#3923: accelerate 1.11.0-1.12.x pass ``ignored_params`` to ``fully_shard`` even when nothing is ignored.

PR #3731 (accelerate 1.11.0) put ``ignored_params`` into every FSDP2 ``fully_shard`` call; ``fully_shard`` takes
that keyword only from torch 2.7 on, so FSDP2 through accelerate on torch 2.6 fails in ``prepare`` with ``TypeError:
fully_shard() got an unexpected keyword argument 'ignored_params'`` (reported with LoRA through ``accelerate launch
--use_fsdp``). PR #3924 (accelerate 1.13.0) passes it only on torch >= 2.7 and when modules are to be ignored.

The cell: LoRA on the tiny Llama, ``Accelerator`` with an FSDP2 plugin and ``prepare`` (on CPU through the shim of
workload/cpu_shim.py), 3 steps and the usual checks. A spy on ``torch.distributed.fsdp.fully_shard`` records the
keywords accelerate passed (``checks["fully_shard_keywords"]``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, List

import torch.distributed.fsdp as fsdp_module

from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.entry import accelerate_setup
from fsdp_matrix.workload.recipe import peft_model
from fsdp_matrix.workload.training import train_and_check

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
    with fully_shard_keywords() as keywords, accelerate_setup(model, params, ctx) as setup:
        checks = setup.checks()
        checks["fully_shard_keywords"] = sorted(keywords)
        checks.update(
            train_and_check(
                setup.model, ctx, trainable=trainable, optimizer=setup.optimizer, backward=setup.accelerator.backward
            )
        )
    return checks


if __name__ == "__main__":
    from fsdp_matrix.standalone import main

    main(run, CASE)
