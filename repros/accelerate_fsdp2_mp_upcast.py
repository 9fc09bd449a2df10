"""accelerate's FSDP2 fp32 upcast under bf16: https://github.com/huggingface/accelerate/issues/3979 (and #3844)"""

from __future__ import annotations

from fsdp_matrix.case import RankContext, axis, main, peft_model, wrap_and_train

CASE = "accelerate-fsdp2-mp-upcast"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    axis(params, "mp", ("bf16",)), axis(params, "wrap", ("fsdp2",))
    model = peft_model(params, ctx)  # a bf16 base, its LoRA kept bf16 by the autocast axis
    return wrap_and_train(model, params, ctx)


if __name__ == "__main__":
    main(run, CASE)
