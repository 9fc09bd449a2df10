"""peft#2129: LoRA on a bf16/fp16 base, and QLoRA on a 4-bit base, under FSDP.

``autocast_adapter_dtype=True`` (PEFT's default) upcasts the adapters to fp32; an FSDP unit holding them with the
half-precision base raises ``Must flatten tensors with uniform dtype``. A 4-bit base stored as uint8 (bitsandbytes'
default) raises ``Cannot flatten integer dtype tensors``. Fixes: autocast off, ``bnb_4bit_quant_storage`` matching
the compute dtype, PEFT's wrap policy, FSDP2.
"""

from __future__ import annotations

from fsdp_matrix.case import RankContext, main, peft_model, wrap_and_train

CASE = "mixed-dtype"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    return wrap_and_train(peft_model(params, ctx), params, ctx)


if __name__ == "__main__":
    main(run, CASE)
