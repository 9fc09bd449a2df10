"""axolotl PR #3403: FSDP2 with LoRA on ``embed_tokens``, each LoRA submodule sharded on its own.

axolotl shards every LoRA submodule with its own ``fully_shard`` before the decoder layers (so the trainable
adapter never shares a unit with the frozen base). For ``lora.Embedding`` it called
``fully_shard(module.lora_embedding_A[adapter])``, but ``lora_embedding_A``/``_B`` are ``ParameterDict``s: the item is
an ``nn.Parameter``, and ``fully_shard`` takes only modules, so a LoRA on ``embed_tokens`` failed as soon as FSDP2
wrapped the model (reported with ``lora_target_modules: [..., embed_tokens]``). PR #3403 (axolotl, 2026-03-05)
shards the whole ``lora.Embedding`` layer instead (``fully_shard`` nests: the units already built stay).

The cell: LoRA on q/v projections and ``embed_tokens`` of the tiny Llama; ``lora_shard`` says how the LoRA
submodules are sharded before ``fully_shard`` per decoder layer and on the root:

- ``none``: not separately (the embedding's LoRA is in the root unit);
- ``per_param``: axolotl before PR #3403: ``lora_A``/``lora_B`` per module, and the embedding's parameters one by one;
- ``module``: PR #3403: ``lora_A``/``lora_B`` per module, and the whole ``lora.Embedding`` layer.

Then 3 steps and every check, the forward check against the unwrapped model included.
"""

from __future__ import annotations

import torch
from peft import get_peft_model
from peft.tuners.lora import LoraLayer
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from fsdp_matrix.workload.adapters import TARGET_MODULES, lora_config
from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.corruption import take_reference
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.params import axis
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import fsdp2, fully_shard

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
    torch.manual_seed(ctx.seed)
    model = get_peft_model(base, lora_config(target_modules=[*TARGET_MODULES, "embed_tokens"]))
    trainable = trainable_names(model)
    reference = take_reference(model, synthetic_batch(ctx))
    how = axis(params, "lora_shard", LORA_SHARD)
    calls = 0 if how == "none" else shard_lora_modules(model, how, init_device_mesh(ctx.device.type, (ctx.world_size,)))
    checks = train_and_check(fsdp2(model, ctx), ctx, trainable=trainable, reference=reference)
    checks["lora_fully_shard_calls"] = calls
    checks["embedding_lora"] = sorted(n for n in trainable if "lora_embedding" in n)
    return checks


if __name__ == "__main__":
    from fsdp_matrix.standalone import main

    main(run, CASE)
