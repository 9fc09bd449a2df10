"""FSDP2 through accelerate with cpu_ram_efficient_loading: https://github.com/axolotl-ai-cloud/axolotl/pull/3977"""

from __future__ import annotations

from fsdp_matrix.case import RankContext, axis, main, materialize_trainable, peft_model, wrap_and_train

CASE = "ram-efficient-untrained"
FIXES = ("none", "materialize")


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    fix = axis(params, "fix", FIXES)
    model = peft_model(params, ctx, autocast=False)
    materialized = materialize_trainable(model, ctx.device) if fix == "materialize" else 0
    checks = wrap_and_train(model, params, ctx)
    return {"materialized_modules": materialized, **checks}


if __name__ == "__main__":
    main(run, CASE)
