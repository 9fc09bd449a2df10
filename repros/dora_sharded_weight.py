"""peft#1984: DoRA under FSDP1 with PEFT's wrap policy and use_orig_params=True.

``lora_A`` is its own FSDP unit, so outside that unit's forward its weight is a 1-D shard, and DoRA reads
``lora_A.weight.shape[1]``: ``IndexError: tuple index out of range``. Needs world size >= 2 (at 1 FSDP1 falls
back to NO_SHARD and the weight keeps its shape). Workarounds: use_orig_params=False, FSDP2.
"""

from __future__ import annotations

from fsdp_matrix.case import RankContext, main, peft_model, wrap_and_train

CASE = "dora-sharded-weight"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    return wrap_and_train(peft_model(params, ctx), params, ctx)


if __name__ == "__main__":
    main(run, CASE)
