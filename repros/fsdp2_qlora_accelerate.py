"""accelerate#3983: FSDP2 QLoRA through accelerate with bitsandbytes' default uint8 ``bnb_4bit_quant_storage``.

The report (torch 2.8.0, accelerate 1.12-era): ``fully_shard`` turns each frozen uint8 ``Params4bit`` into an
``nn.Parameter`` with the default ``requires_grad=True`` (``RuntimeError: only Tensors of floating point dtype can
require gradients``, pytorch#177844), or, where that is bypassed, trains with a corrupted quant state (loss 0.0,
grad norm nan). accelerate PR #3987 (1.14.0) passes the non-floating frozen ``Params4bit`` to ``fully_shard`` as
``ignored_params``, with a UserWarning, so they stay whole on every rank.

The cell: a tiny Llama loaded in 4-bit through transformers' bitsandbytes quantizer (``storage``: ``uint8``, the
default, or ``bf16``, the documented workaround), LoRA, ``Accelerator`` with an FSDP2 plugin and ``prepare`` (on CPU
through the shim of workload/cpu_shim.py), 3 steps. Besides the usual checks, the loss of the first step must equal
the unwrapped model's loss on the same batch (a corrupted quant state changes it), and the checks record what
accelerate did with the 4-bit weights (sharded as DTensors or left whole) and its warning.
"""

from __future__ import annotations

import math
import warnings

import torch

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.checks import DTensor, trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.entry import accelerate_setup
from fsdp_matrix.workload.params import axis
from fsdp_matrix.workload.recipe import peft_model
from fsdp_matrix.workload.training import synthetic_batch, train_and_check

CASE = "fsdp2-qlora-accelerate"

LOSS_RTOL = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 1e-3}
"""How close the first FSDP2 step's loss must be to the unwrapped model's: the same forward, so only the
reduction order may differ (observed equal to 5 digits in fp32)."""


def four_bit_weights(model: torch.nn.Module) -> dict:
    """How the bitsandbytes 4-bit base weights came out of ``prepare``: sharded (DTensor) or whole, and their dtype."""
    from bitsandbytes.nn import Linear4bit

    sharded, whole, dtypes = 0, 0, set()
    for module in model.modules():
        if isinstance(module, Linear4bit):
            weight = module.weight
            sharded += isinstance(weight, DTensor)
            whole += not isinstance(weight, DTensor)
            dtypes.add(str(weight.dtype))
    return {
        "linear4bit_weights_sharded": sharded,
        "linear4bit_weights_whole": whole,
        "linear4bit_dtypes": sorted(dtypes),
    }


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    params = {"adapter": "qlora", "entry": "accelerate", "wrap": "fsdp2", **params}
    model = peft_model(params, ctx)
    trainable = trainable_names(model)
    batch = synthetic_batch(ctx)
    with torch.no_grad():
        unwrapped_loss = float(model(input_ids=batch, labels=batch).loss)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerate_setup(model, params, ctx) as setup:
            checks = setup.checks()
            checks.update(four_bit_weights(setup.model))
            checks.update(
                train_and_check(
                    setup.model,
                    ctx,
                    trainable=trainable,
                    optimizer=setup.optimizer,
                    backward=setup.accelerator.backward,
                )
            )
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
    from fsdp_matrix.standalone import main

    main(run, CASE)
