"""PEFT on meta before sharding, then the base checkpoint: https://github.com/huggingface/peft/issues/2945"""

from __future__ import annotations

import torch
from peft import get_peft_model
from torch.distributed.tensor import distribute_tensor
from transformers import LlamaConfig, LlamaForCausalLM

from fsdp_matrix.case import (
    TINY_SHAPE,
    CheckFailed,
    DTensor,
    RankContext,
    axis,
    build_model,
    clean_name,
    fsdp2,
    lora_config,
    main,
    train_and_check,
    trainable_names,
)

CASE = "peft-meta-base-load"
LOADS = ("plain", "plain_nonstrict", "peft_api", "peft_api_dtensor")


def _load(model: torch.nn.Module, checkpoint: dict, how: str) -> object:
    if how == "plain":
        return model.load_state_dict(checkpoint)
    if how == "plain_nonstrict":
        return model.load_state_dict(checkpoint, strict=False)
    from peft import get_base_model_state_dict, set_base_model_state_dict  # peft >= 0.20.0 (PR #3000)

    if how == "peft_api_dtensor":
        # shard each full tensor like the parameter it loads into: the current base state dict, under the original
        # key names, holds each parameter's mesh and placements
        current = get_base_model_state_dict(model)
        checkpoint = {
            key: distribute_tensor(value, current[key].device_mesh, current[key].placements)
            if key in current and isinstance(current[key], DTensor)
            else value
            for key, value in checkpoint.items()
        }
    return set_base_model_state_dict(model, checkpoint)


def _init_adapters(model: torch.nn.Module) -> int:
    # to_empty gives the adapters uninitialised memory; re-run PEFT's own init (lora_A kaiming, lora_B zero)
    count = 0
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "reset_lora_parameters") and "default" in getattr(module, "lora_A", {}):
                module.reset_lora_parameters("default", True)
                count += 1
    return count


def _copy_buffers(model: torch.nn.Module, reference: torch.nn.Module) -> int:
    # the rotary inv_freq is a non-persistent buffer (not in any checkpoint) that to_empty leaves uninitialised;
    # every loader recomputes it (TorchTitan calls its init_weights): copy it from a model built normally
    count = 0
    for name, module in reference.named_modules():
        target = model.get_submodule(f"base_model.model.{name}" if name else "base_model.model")
        for attr, value in list(vars(module).items()) + list(module.named_buffers(recurse=False)):
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                setattr(target, attr, value.detach().clone().to(next(iter(model.parameters())).device))
                count += 1
    return count


def _base_mismatches(model: torch.nn.Module, checkpoint: dict) -> list:
    """Names of base tensors whose gathered value differs from the checkpoint's (the PEFT infixes removed)."""
    wrong = []
    for name, param in model.named_parameters():
        if param.requires_grad:
            continue
        key = clean_name(name).removeprefix("base_model.model.").replace(".base_layer.", ".")
        full = param.full_tensor() if isinstance(param, DTensor) else param
        expected = checkpoint.get(key)
        if expected is None:
            wrong.append(f"{key} (not in the checkpoint)")
        elif not torch.equal(full.detach().cpu(), expected):
            wrong.append(f"{key} (max |diff| {float((full.detach().cpu() - expected).abs().max()):.3g})")
    return wrong


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    how = axis(params, "load", LOADS)
    axis(params, "wrap", ("fsdp2",), default="fsdp2")  # shards with fully_shard, as peft#2945 does
    reference = build_model(axis(params, "model", ("llama",)), "fp32", ctx).to("cpu")
    checkpoint = reference.state_dict()
    with torch.device("meta"):
        model = get_peft_model(
            LlamaForCausalLM(LlamaConfig(**TINY_SHAPE)),
            lora_config(),
        )
    trainable = trainable_names(model)
    model = fsdp2(model, ctx)
    model.to_empty(device=ctx.device)
    buffers = _copy_buffers(model, reference)
    result = _load(model, checkpoint, how)
    checks = {
        "buffers_copied": buffers,
        "missing_keys": len(getattr(result, "missing_keys", [])),
        "unexpected_keys": len(getattr(result, "unexpected_keys", [])),
        "adapters_initialised": _init_adapters(model),
    }
    wrong = _base_mismatches(model, checkpoint)
    if wrong:
        raise CheckFailed(
            f"{len(wrong)} base tensors on rank {ctx.rank} differ from the checkpoint after loading "
            f"({checks['missing_keys']} keys missing, {checks['unexpected_keys']} unexpected): {', '.join(wrong[:3])}"
        )
    return {**checks, **train_and_check(model, ctx, trainable=trainable)}


if __name__ == "__main__":
    main(run, CASE)
