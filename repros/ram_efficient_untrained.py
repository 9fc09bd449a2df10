"""axolotl PR #3977 (axolotl#3772): FSDP2 through accelerate with ``cpu_ram_efficient_loading``, where the LoRA
shards of ranks > 0 are never trained, without an error.

Ram-efficient loading leaves ranks > 0 with the base and the adapter on the meta device. accelerate's FSDP2
``prepare`` swaps the optimizer's parameters for the sharded ones through a map keyed by ``data_ptr()``
(``fsdp2_switch_optimizer_parameters``); every meta tensor's ``data_ptr()`` is 0, so on ranks > 0 the optimizer ends up
stepping one tensor under every name. The loss goes down (rank 0's shards train) and every full tensor changed; only
the per-shard "nothing left untrained" check (corruption.py) sees rank 1's pieces unchanged.

axolotl's fix gives the trainable parameters real storage on every rank before the optimizer is built
(``fix: materialize`` here: ``to_empty`` on each module whose own parameters require grad and are on meta; their
values still arrive from rank 0 in ``prepare``). ``init: full`` is the control.
"""

from __future__ import annotations

from fsdp_matrix.case import RankContext, axis, has_meta, main, peft_model, wrap_and_train

CASE = "ram-efficient-untrained"
FIXES = ("none", "materialize")


def materialize_trainable(model, ctx: RankContext) -> int:
    """``to_empty`` on every module whose own trainable parameters are on meta; returns how many modules."""
    count = 0
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if own and has_meta(module, recurse=False):
            module.to_empty(device=ctx.device, recurse=False)
            count += 1
    return count


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    fix = axis(params, "fix", FIXES)
    model = peft_model(params, ctx, autocast=False)
    materialized = materialize_trainable(model, ctx) if fix == "materialize" else 0
    checks = wrap_and_train(model, params, ctx)
    return {"materialized_modules": materialized, **checks}


if __name__ == "__main__":
    main(run, CASE)
