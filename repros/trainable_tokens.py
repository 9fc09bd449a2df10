"""LoRA with trainable tokens under FSDP: https://github.com/huggingface/peft/pull/2681"""

from __future__ import annotations

import torch
from peft import get_peft_model, get_peft_model_state_dict
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

from fsdp_matrix.case import (
    CheckFailed,
    RankContext,
    base_model,
    clean_name,
    full_parameters,
    lora_config,
    main,
    synthetic_batch,
    train_and_check,
    trainable_names,
    wrap_cell,
    wrapper_kind,
)

CASE = "trainable-tokens"


def adapter_state_dict(model: torch.nn.Module) -> dict:
    """``get_peft_model_state_dict`` of a wrapped model over its full state dict, as accelerate's FSDP save does."""
    if wrapper_kind(model) == "fsdp1":
        # offload_to_cpu=False: on CPU the offload path frees storage the state dict still uses
        config = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
        with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
            state = get_peft_model_state_dict(model)
    else:
        state = get_peft_model_state_dict(model)
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    tokens = sorted({int(t) for t in synthetic_batch(ctx)[0, :3]})
    config = lora_config(trainable_token_indices=tokens)
    torch.manual_seed(ctx.seed)  # the same adapter on every rank
    model = get_peft_model(base_model(params, ctx), config)
    trainable = trainable_names(model)
    wrapped = wrap_cell(model, params, ctx)
    checks = train_and_check(wrapped, ctx, trainable=trainable)
    saved = adapter_state_dict(wrapped)
    trained = {clean_name(n): t for n, t in full_parameters(wrapped, wrapper_kind(wrapped)).items()}
    # PEFT's saved keys drop the adapter name: ...lora_A.default.weight -> ...lora_A.weight
    missing = [n for n in trainable if n.replace(".default", "") not in saved]
    differ = [
        n
        for n in trainable
        if n not in missing
        and not torch.equal(saved[n.replace(".default", "")].detach().cpu().reshape(-1).view(torch.uint8), trained[n])
    ]
    checks.update(tokens=tokens, saved_tensors=len(saved), saved_missing=missing, saved_differ=differ)
    if missing or differ:
        raise CheckFailed(
            f"adapter state dict: {len(missing)}/{len(trainable)} trainable tensors missing {missing[:3]}, "
            f"{len(differ)} differ from the trained ones {differ[:3]}"
        )
    return checks


if __name__ == "__main__":
    main(run, CASE)
