"""Full state dict of FSDP QLoRA: https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1405"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from fsdp_matrix.case import (
    CheckFailed,
    RankContext,
    axis,
    flag,
    gathered_parameters,
    main,
    peft_model,
    trainable_names,
    wrap_cell_and_train,
)

CASE = "qlora-full-state-dict"


def _check_adapters(state: dict, expected: dict, rank: int) -> int:
    wrong = []
    for key, raw in expected.items():
        value = state.get(key)
        if value is None:
            wrong.append(f"{key} missing")
            continue
        got = value.detach().reshape(-1).contiguous().view(torch.uint8).cpu()
        if not torch.equal(got, raw):
            wrong.append(f"{key} differs from the trained tensor (shape {list(value.shape)})")
    if wrong:
        raise CheckFailed(
            f"full state dict on rank {rank}: {len(wrong)}/{len(expected)} adapters wrong: {'; '.join(wrong[:3])}"
        )
    return len(expected)


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    axis(params, "adapter", ("qlora",))
    offload = flag(params, "offload")
    model = peft_model(params, ctx)
    trainable = trainable_names(model)
    wrapped, checks = wrap_cell_and_train(model, params, ctx)
    expected = gathered_parameters(wrapped, trainable)
    # the report's call: a full, CPU-offloaded state dict of the whole FSDP QLoRA model
    state = get_model_state_dict(wrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
    checks["state_dict_keys"] = len(state)
    checks["quant_state_keys"] = sum(".absmax" in k or ".quant_map" in k for k in state)
    if state or not offload or ctx.rank == 0:
        checks["adapter_tensors_checked"] = _check_adapters(state, expected, ctx.rank)
    return checks


if __name__ == "__main__":
    main(run, CASE)
