"""Soup#352: a compiled PEFT model's FSDP checkpoint holds the whole model, not the adapter.

The Trainer saves an FSDP checkpoint of a PEFT model with ``save_fsdp_model(..., adapter_only=True)``; accelerate
keeps the adapter only if ``is_peft_model(model)``, which looks at ``extract_model_from_parallel(model)``. That puts
the ``torch.compile`` wrapper back on what it unwrapped (always before accelerate 1.3.0; from 1.3.0, PR #3282, under
``keep_torch_compile=True``, the default), so a compiled model is not a ``PeftModel`` there and the whole state dict
is saved: reported as a 37 GB ``pytorch_model_fsdp.bin`` beside a 131 MB adapter
(https://github.com/MakazhanAlpamys/Soup/issues/352).

The cell: LoRA on the tiny Llama, FSDP1 through ``Accelerator.prepare`` with ``compile`` none or whole
(``TorchDynamoPlugin``, ``backend="eager"`` on CPU), 3 steps, then ``save_fsdp_model(adapter_only=True)`` as the
Trainer calls it; the saved file must hold the adapter's tensors and nothing else.
"""

from __future__ import annotations

from pathlib import Path

import torch
from accelerate.utils import save_fsdp_model

from fsdp_matrix.case import (
    CheckFailed,
    RankContext,
    accelerate_setup,
    cell_dir,
    is_adapter,
    main,
    on_every_rank,
    peft_model,
    train_and_check,
    trainable_names,
)

CASE = "accelerate-compile-adapter-checkpoint"


def _judge(out: Path, adapter_tensors: int) -> dict:
    files = sorted(p.name for p in out.iterdir())
    if files != ["pytorch_model_fsdp.bin"]:
        raise CheckFailed(f"save_fsdp_model wrote {files}, expected pytorch_model_fsdp.bin")
    keys = list(torch.load(str(out / files[0]), map_location="cpu", weights_only=True))
    base = [k for k in keys if not is_adapter(k)]
    if base:
        raise CheckFailed(
            f"pytorch_model_fsdp.bin holds {len(base)} base-model tensors beside {len(keys) - len(base)} adapter "
            f"tensors (adapter_only=True), e.g. {base[0]}"
        )
    if len(keys) != adapter_tensors:
        raise CheckFailed(f"pytorch_model_fsdp.bin holds {len(keys)}/{adapter_tensors} adapter tensors")
    return {"checkpoint_keys": len(keys), "checkpoint_key": keys[0]}


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    model = peft_model(params, ctx)
    trainable = trainable_names(model)
    with cell_dir(ctx, params) as out:
        with accelerate_setup(model, params, ctx, saves=True) as setup:
            acc = setup.accelerator
            checks = {
                **setup.checks(),
                **train_and_check(
                    setup.model, ctx, trainable=trainable, optimizer=setup.optimizer, backward=acc.backward
                ),
            }
            save_fsdp_model(acc.state.fsdp_plugin, acc, setup.model, str(out), adapter_only=True)
            on_every_rank(lambda: None)
        return {**checks, **on_every_rank(lambda: _judge(out, len(trainable)))}


if __name__ == "__main__":
    main(run, CASE)
