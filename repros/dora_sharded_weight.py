"""DoRA under FSDP1 with PEFT's wrap policy: https://github.com/huggingface/peft/issues/1984"""

from __future__ import annotations

from fsdp_matrix.case import RankContext, main, peft_model, wrap_and_train

CASE = "dora-sharded-weight"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    return wrap_and_train(peft_model(params, ctx), params, ctx)


if __name__ == "__main__":
    main(run, CASE)
