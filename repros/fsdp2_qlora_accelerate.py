"""FSDP2 QLoRA through accelerate, uint8 4-bit storage: https://github.com/huggingface/accelerate/issues/3983"""

from __future__ import annotations

import math

import torch

from fsdp_matrix.case import (
    CheckFailed,
    DTensor,
    RankContext,
    axis,
    caught_warnings,
    linear4bit_layers,
    main,
    peft_model,
    prepare_and_train,
    synthetic_batch,
    trainable_names,
)

CASE = "fsdp2-qlora-accelerate"

LOSS_RTOL = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 1e-3}
"""How close the first FSDP2 step's loss must be to the unwrapped model's: the same forward, so only the
reduction order may differ (observed equal to 5 digits in fp32)."""


def four_bit_weights(model: torch.nn.Module) -> dict:
    """How the bitsandbytes 4-bit base weights came out of ``prepare``: sharded (DTensor) or whole, and their dtype."""
    weights = [m.weight for m in linear4bit_layers(model).values()]
    return {
        "linear4bit_weights_sharded": sum(isinstance(w, DTensor) for w in weights),
        "linear4bit_weights_whole": sum(not isinstance(w, DTensor) for w in weights),
        "linear4bit_dtypes": sorted({str(w.dtype) for w in weights}),
    }


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    params = {"adapter": "qlora", "entry": "accelerate", "wrap": "fsdp2", **params}
    model = peft_model(params, ctx)
    trainable = trainable_names(model)
    batch = synthetic_batch(ctx)
    with torch.no_grad():
        unwrapped_loss = float(model(input_ids=batch, labels=batch).loss)
    with caught_warnings() as caught:
        checks = prepare_and_train(model, params, ctx, trainable, inspect=four_bit_weights)
    checks["accelerate_warnings"] = sorted(
        {str(w.message).splitlines()[0][:200] for w in caught if "Params4bit" in str(w.message)}
    )
    checks["unwrapped_loss"] = unwrapped_loss
    first = checks["losses"][0]
    rtol = LOSS_RTOL[axis(params, "dtype", tuple(LOSS_RTOL), default="fp32")]
    if not (math.isfinite(first) and abs(first - unwrapped_loss) <= rtol * abs(unwrapped_loss)):
        raise CheckFailed(
            f"first FSDP2 step's loss {first:.6g} differs from the unwrapped model's {unwrapped_loss:.6g} on the "
            f"same batch (rtol {rtol:g}): the 4-bit weights did not survive fully_shard "
            f"({checks['linear4bit_weights_sharded']} sharded as DTensors)"
        )
    return checks


if __name__ == "__main__":
    main(run, CASE)
