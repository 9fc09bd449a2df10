"""LoRA with trainable tokens under FSDP: https://github.com/huggingface/peft/pull/2681"""

from __future__ import annotations

import torch
from peft import get_peft_model, get_peft_model_state_dict

from fsdp_matrix.case import (
    CheckFailed,
    RankContext,
    base_model,
    fsdp1_full_state_dict,
    gathered_parameters,
    lora_config,
    main,
    synthetic_batch,
    trainable_names,
    wrap_cell_and_train,
)

CASE = "trainable-tokens"


def adapter_state_dict(model: torch.nn.Module) -> dict:
    """``get_peft_model_state_dict`` of a wrapped model over its full state dict, as accelerate's FSDP save does."""
    with fsdp1_full_state_dict(model):
        state = get_peft_model_state_dict(model)
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    tokens = sorted({int(t) for t in synthetic_batch(ctx)[0, :3]})
    config = lora_config(trainable_token_indices=tokens)
    torch.manual_seed(ctx.seed)  # the same adapter on every rank
    model = get_peft_model(base_model(params, ctx), config)
    trainable = trainable_names(model)
    wrapped, checks = wrap_cell_and_train(model, params, ctx)
    saved = adapter_state_dict(wrapped)
    trained = gathered_parameters(wrapped)
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
