"""accelerate PR #4022 (1.14.0): FSDP2 with regional compilation, the per-layer FSDP hooks never fire.

``TorchDynamoPlugin(use_regional_compilation=True)`` (accelerate 1.7.0, PR #3529) compiles each repeated block; from
1.8.0 (PR #3585) that runs before ``fully_shard``. Each block becomes an ``OptimizedModule`` whose call bypasses
the hooks ``fully_shard`` adds to the block: no per-layer unshard and reshard (2.4x slower in the PR's measurement),
no error. 1.14.0 compiles after sharding.

The cell: LoRA on the tiny Llama, FSDP2 through ``Accelerator.prepare`` with ``compile`` none, regional or whole
(``backend="eager"`` on CPU). The collectives check (workload/collectives.py) counts each unit's all-gathers per
optimizer step: a decoder layer with none is the bug.
"""

from __future__ import annotations

from fsdp_matrix.case import RankContext, main, peft_model, wrap_and_train

CASE = "accelerate-regional-compile"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    return wrap_and_train(peft_model(params, ctx), params, ctx)


if __name__ == "__main__":
    main(run, CASE)
