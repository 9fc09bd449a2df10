"""A custom adapter saver reading ``param.data.cpu()`` under FSDP2: https://github.com/kvcache-ai/ktransformers/issues/2147"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from fsdp_matrix.case import (
    RAW_PATHS,
    DTensor,
    RankContext,
    adapter_key,
    axis,
    cell_dir,
    check_saved,
    full_shapes,
    gathered_adapter,
    is_adapter,
    main,
    on_every_rank,
    peft_model,
    read_adapter_dir,
    wrap_cell_and_train,
)

CASE = "fsdp2-custom-adapter-saver"
SAVERS = ("data_cpu", "data_cpu_torch", "full_tensor", "get_model_state_dict")
"""``data_cpu``: ktransformers' ``weight.data.cpu().clone()`` into a dict written with safetensors (its
``save_lora_experts_to_adapter``); ``data_cpu_torch``: the same dict written with ``torch.save``; ``full_tensor``:
``full_tensor()`` on every rank first (the fix); ``get_model_state_dict``: torch.distributed.checkpoint's
``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` then PEFT's ``get_peft_model_state_dict``."""


def custom_state(model: nn.Module, saver: str) -> dict:
    """The adapter tensors as the custom saver collects them, by adapter key. ``full_tensor`` is collective."""
    state = {}
    for name, param in model.named_parameters():
        if not is_adapter(name):
            continue
        if saver == "full_tensor" and isinstance(param, DTensor):
            state[adapter_key(name)] = param.full_tensor().detach().cpu().clone()
        else:
            # under FSDP2 ``param.data`` is a DTensor still: ``.cpu().clone()`` keeps it one, holding the local shard
            state[adapter_key(name)] = param.data.cpu().clone()
    return state


def write_custom(state: dict, saver: str, out: Path) -> None:
    """Rank 0's file, where ``read_adapter_dir`` reads it (``torch.save`` pickles a DTensor with its shard)."""
    if saver == "data_cpu_torch":
        torch.save(state, str(out / "adapter_model.bin"))
        return
    from safetensors.torch import save_file

    save_file(state, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    saver = axis(params, "saver", SAVERS)
    model = peft_model(params, ctx)
    expected = full_shapes(model)
    wrapped, checks = wrap_cell_and_train(model, params, ctx)
    trained = gathered_adapter(wrapped)
    sample = next(p for n, p in wrapped.named_parameters() if is_adapter(n))
    checks["adapter_param_type"] = type(sample.data).__name__
    with cell_dir(ctx, params) as out:
        if saver == "get_model_state_dict":
            RAW_PATHS["fsdp2_full"].save(wrapped, ctx, out)
        else:
            state = custom_state(wrapped, saver)
            on_every_rank(lambda: write_custom(state, saver, out) if ctx.is_main else None)
        # every rank reads rank 0's file back: the saved shapes, against the full ones and the trained values
        checks.update(on_every_rank(lambda: check_saved(read_adapter_dir(out), expected, trained)))
    return checks


if __name__ == "__main__":
    main(run, CASE)
