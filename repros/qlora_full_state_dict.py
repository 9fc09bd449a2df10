"""bitsandbytes#1405 (fix: bitsandbytes PR #1866): ``get_model_state_dict(model, StateDictOptions(full_state_dict=True,
cpu_offload=True))`` on an FSDP QLoRA model raises ``AttributeError: 'Params4bit' object has no attribute 'absmax'``.

``Linear4bit._save_to_state_dict`` writes the quantization state as extra keys under the weight
(``...weight.absmax``, ``...weight.quant_map``, ``...weight.quant_state.bitsandbytes__nf4``), and torch's
``_get_fqns`` resolves every key by ``getattr`` along its dots, so it asks the ``Params4bit`` weight for ``absmax``.
PR #1866 makes ``Params4bit`` answer those names from its ``quant_state`` (in bitsandbytes 0.50.2 as properties).
The report's code (llama-recipes ``save_peft_checkpoint``) then passes the state dict to ``save_pretrained``.

The base is the tiny llama loaded in 4-bit through transformers (bitsandbytes quantizes on the CPU from 0.47), with
bf16 compute and bf16 quant storage, so FSDP1 can flatten it, and LoRA not upcast (``autocast`` 0) so one decoder
layer unit holds one dtype. Axis ``offload``: the ``cpu_offload`` option (1 is the report's). After 3 training steps
with the usual checks, a fix holds when the state dict is returned and, on every rank that gets one (with
``cpu_offload`` only rank 0), it holds every trained adapter tensor at its unsharded shape and value.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from fsdp_matrix.case import (
    CheckFailed,
    RankContext,
    axis,
    clean_name,
    flag,
    full_parameters,
    main,
    peft_model,
    train_and_check,
    trainable_names,
    wrap_cell,
    wrapper_kind,
)

CASE = "qlora-full-state-dict"


def _check_adapters(state: dict, expected: dict, rank: int) -> int:
    wrong = []
    for name, raw in expected.items():
        key = clean_name(name)
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
    wrapped = wrap_cell(model, params, ctx)
    checks = train_and_check(wrapped, ctx, trainable=trainable)
    expected = full_parameters(wrapped, wrapper_kind(wrapped), None)
    expected = {n: v for n, v in expected.items() if clean_name(n) in set(trainable)}
    # the report's call: a full, CPU-offloaded state dict of the whole FSDP QLoRA model
    state = get_model_state_dict(wrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
    checks["state_dict_keys"] = len(state)
    checks["quant_state_keys"] = sum(".absmax" in k or ".quant_map" in k for k in state)
    if state or not offload or ctx.rank == 0:
        checks["adapter_tensors_checked"] = _check_adapters(state, expected, ctx.rank)
    return checks


if __name__ == "__main__":
    main(run, CASE)
