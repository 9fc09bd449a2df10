"""transformers PR #35234 (pytorch#143536): saving an adapter under FSDP1 hangs, because only rank 0 gathers.

The Trainer's ``save_model`` under FSDP gathers the full state dict on every rank (a collective), then calls
``save_pretrained(output_dir, state_dict=state_dict)`` on rank 0 only. For a transformers model that holds its
adapter through transformers' own PEFT integration (``model.add_adapter(LoraConfig(...))``), ``save_pretrained``
ignored the ``state_dict`` it was given and called ``get_adapter_state_dict()``, which calls ``model.state_dict()``
again: FSDP1's FULL_STATE_DICT hooks all-gather every unit, on rank 0 alone, and rank 0 waits forever (on GPU until
the NCCL watchdog kills the job, "Watchdog caught collective operation timeout" in the PR). PR #35234 (transformers
4.51.0) passes ``state_dict`` through to ``get_peft_model_state_dict``.

The cell does what ``Trainer.save_model`` does, without the Trainer: LoRA on the tiny Llama, FSDP1 with the
decoder-layer policy and ``use_orig_params=True``, 3 steps (the usual checks), then every rank gathers the full
state dict and rank 0 alone calls ``save_pretrained(dir, state_dict=...)``. The other ranks wait for rank 0's word
on a file, outside any collective, as the Trainer's other ranks have moved on. Rank 0 then reads the adapter file
back: every adapter tensor with its full shape and the trained values. A hang is recorded with every rank's stack.

Axis ``via`` (how the model holds its adapter):

- ``hf_add_adapter``: transformers' integration, ``model.add_adapter(config)``: the report's path.
- ``peft_model``: ``get_peft_model``: ``PeftModel.save_pretrained`` always handed ``state_dict`` on (contrast).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import torch
from torch import distributed as dist
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import is_adapter, lora_config
from fsdp_matrix.workload.checkpoint import adapter_key, cell_dir, check_saved, full_shapes, read_adapter_dir
from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.params import axis
from fsdp_matrix.workload.training import train_and_check
from fsdp_matrix.workload.wrapping import decoder_layer_policy, fsdp1

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
    from fsdp_matrix.standalone import main

    main(run, CASE)
