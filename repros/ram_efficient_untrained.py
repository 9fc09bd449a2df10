"""FSDP2 through accelerate with cpu_ram_efficient_loading: https://github.com/axolotl-ai-cloud/axolotl/pull/3977"""

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
