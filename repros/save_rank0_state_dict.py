"""save_pretrained on rank 0 only under FSDP1 hangs: https://github.com/huggingface/transformers/pull/35234"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import torch
from torch import distributed as dist
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from fsdp_matrix.case import (
    CheckFailed,
    RankContext,
    adapter_key,
    axis,
    build_model,
    cell_dir,
    check_saved,
    decoder_layer_policy,
    fsdp1,
    full_shapes,
    is_adapter,
    lora_config,
    main,
    read_adapter_dir,
    train_and_check,
    trainable_names,
)

CASE = "save-rank0-state-dict"
VIA = ("hf_add_adapter", "peft_model")
WAIT_S = 600.0
"""How long the other ranks wait for rank 0's word: longer than any cell timeout, so a hang is rank 0's alone."""


def _adapted(params: dict, ctx: RankContext) -> torch.nn.Module:
    model = build_model(axis(params, "model", ("llama",), default="llama"), "fp32", ctx)
    torch.manual_seed(ctx.seed)
    if axis(params, "via", VIA) == "hf_add_adapter":
        model.add_adapter(lora_config(task_type=None))
        return model
    from peft import get_peft_model

    return get_peft_model(model, lora_config())


def _wait_for(path, ctx: RankContext) -> dict:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {ctx.rank}: rank 0 did not finish save_pretrained within {WAIT_S:.0f}s")
        time.sleep(0.05)
    return json.loads(path.read_text())


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    model = _adapted(params, ctx)
    trainable, shapes = trainable_names(model), full_shapes(model)
    wrapped = fsdp1(model, decoder_layer_policy(model), True, ctx)
    checks = train_and_check(wrapped, ctx, trainable=trainable)
    with cell_dir(ctx, params) as out:
        with FSDP.state_dict_type(
            wrapped, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
        ):
            state = wrapped.state_dict()  # every rank: the gather is a collective (Trainer.save_model's get_state_dict)
        done = out / "rank0-saved.json"
        if ctx.is_main:
            word = {"error": None}
            try:
                wrapped.module.save_pretrained(str(out / "adapter"), state_dict=state)  # Trainer._save, rank 0 only
                checks["saved"] = _check_file(out / "adapter", shapes, state)
            except Exception as exc:  # noqa: BLE001 - said to the other ranks, then raised here
                word = {"error": f"{type(exc).__name__}: {exc}"}
                raise
            finally:
                done.write_text(json.dumps(word))
        else:
            word = _wait_for(done, ctx)
            if word["error"]:
                raise CheckFailed(f"rank 0's save_pretrained raised: {word['error']}")
        dist.barrier()
    return checks


def _tail(key: str) -> str:
    # the two paths spell the prefix differently (base_model.model. or none): from the decoder layers on they agree
    key = adapter_key(key)
    return "layers." + key.split("layers.", 1)[1] if "layers." in key else key


def _check_file(path, shapes: dict, state: dict) -> dict:
    """Every adapter tensor is in the written file, with its full shape and the trained (gathered) values."""
    saved = read_adapter_dir(path)
    saved = replace(
        saved,
        shapes={_tail(k): v for k, v in saved.shapes.items()},
        tensors={_tail(k): v for k, v in saved.tensors.items()},
    )
    trained = {_tail(k): v for k, v in state.items() if is_adapter(k)}
    return check_saved(saved, {_tail(k): v for k, v in shapes.items()}, trained)


if __name__ == "__main__":
    main(run, CASE)
