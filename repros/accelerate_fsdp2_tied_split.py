"""accelerate 1.14.0's FSDP2 tail group splits tied embeddings: https://github.com/huggingface/accelerate/pull/4171"""

from __future__ import annotations

from fsdp_matrix.case import RankContext, main, peft_model, wrap_and_train

CASE = "accelerate-fsdp2-tied-split"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    params = {"adapter": "lora", "entry": "accelerate", "wrap": "fsdp2", **params}
    return wrap_and_train(peft_model(params, ctx), params, ctx)


if __name__ == "__main__":
    main(run, CASE)
