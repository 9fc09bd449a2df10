"""FSDP2 with LoRA on embed_tokens, each LoRA module sharded: https://github.com/axolotl-ai-cloud/axolotl/pull/3403"""

from __future__ import annotations

from peft.tuners.lora import LoraLayer
from torch import nn

from fsdp_matrix.case import (
    TARGET_MODULES,
    RankContext,
    add_adapter,
    axis,
    build_model,
    device_mesh,
    fsdp2,
    fully_shard,
    main,
    synthetic_batch,
    take_reference,
    train_and_check,
    trainable_names,
)

CASE = "fsdp2-lora-embedding"
LORA_SHARD = ("none", "per_param", "module")


def shard_lora_modules(model: nn.Module, how: str, mesh) -> int:
    """axolotl's ``_process_lora_module_for_fsdp`` before (``per_param``) and after (``module``) PR #3403; returns
    the number of ``fully_shard`` calls."""
    calls = 0
    for module in model.modules():
        if not isinstance(module, LoraLayer):
            continue
        for name in module.active_adapters:
            for holder in (module.lora_A, module.lora_B):
                if name in holder:
                    fully_shard(holder[name], mesh=mesh)
                    calls += 1
            if how == "per_param":
                for holder in (module.lora_embedding_A, module.lora_embedding_B):
                    if name in holder:
                        fully_shard(holder[name], mesh=mesh)  # an nn.Parameter, not a module
                        calls += 1
        if how == "module" and (len(module.lora_embedding_A) or len(module.lora_embedding_B)):
            fully_shard(module, mesh=mesh)
            calls += 1
    return calls


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    base = build_model(axis(params, "model", ("llama",), default="llama"), "fp32", ctx)
    model = add_adapter(base, "lora", ctx.seed, target_modules=[*TARGET_MODULES, "embed_tokens"])
    trainable = trainable_names(model)
    reference = take_reference(model, synthetic_batch(ctx))
    how = axis(params, "lora_shard", LORA_SHARD)
    calls = 0 if how == "none" else shard_lora_modules(model, how, device_mesh(ctx))
    checks = train_and_check(fsdp2(model, ctx), ctx, trainable=trainable, reference=reference)
    checks["lora_fully_shard_calls"] = calls
    checks["embedding_lora"] = sorted(n for n in trainable if "lora_embedding" in n)
    return checks


if __name__ == "__main__":
    main(run, CASE)
