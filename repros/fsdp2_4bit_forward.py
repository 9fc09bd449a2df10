"""bitsandbytes#1945 (and #1424): FSDP2 ``fully_shard`` on ``Linear4bit`` with bf16 quant storage changes the forward.

With ``bnb_4bit_quant_storage=torch.bfloat16`` the packed NF4 nibbles live in a bf16-typed tensor, so FSDP2 can
shard it. About 0.1% of those 16-bit words happen to be bf16 NaN bit patterns. The report (CUDA, NCCL) finds that
FSDP2's unshard path canonicalizes every NaN to one quiet-NaN pattern, so ``matmul_4bit`` decodes other NF4 indices
than were stored: the forward is wrong, silently, whatever the wrap granularity. No fix is released.

The cell: the tiny Llama loaded in 4-bit with bf16 storage (transformers' bitsandbytes quantizer, as QLoRA users
load), LoRA, FSDP2 per decoder layer then the root (``fsdp2``) or the root only (``fsdp2_root``), 3 steps with every
check, the forward check against the unwrapped model included (workload/corruption.py: it names the first module
whose output differs). Besides, a forward pre-hook on every ``Linear4bit`` compares the 16-bit words its weight holds
inside the wrapped forward with the words it held before wrapping; ``checks["nan_words"]`` counts the stored words
that are NaN patterns (the ones the report says are rewritten) and ``checks["changed_words"]`` those that changed. A
changed word fails the cell, naming the module and the rank, even where the logits stay within tolerance.
"""

from __future__ import annotations

from typing import Dict

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.checks import DTensor, trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.corruption import take_reference
from fsdp_matrix.workload.params import axis
from fsdp_matrix.workload.recipe import peft_model
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import fsdp2, fully_shard

CASE = "fsdp2-4bit-forward"


def _linear4bit(model: nn.Module) -> Dict[str, nn.Module]:
    import bitsandbytes as bnb

    return {n: m for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}


def _words(weight: torch.Tensor) -> torch.Tensor:
    local = weight.to_local() if isinstance(weight, DTensor) else weight
    return local.detach().contiguous().view(torch.int16).flatten().cpu().clone()


def _nan_words(words: torch.Tensor) -> int:
    bits = words.to(torch.int32) & 0xFFFF
    return int((((bits >> 7) & 0xFF) == 0xFF).logical_and((bits & 0x7F) != 0).sum())


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    params = {"adapter": "qlora", "dtype": "bf16", "storage": "bf16", "model": "llama", **params}
    model = peft_model(params, ctx)
    layers = _linear4bit(model)
    if not layers:
        raise CheckFailed("no Linear4bit layer was built: nothing to check")
    before = {n: _words(m.weight) for n, m in layers.items()}
    stored = sorted({str(m.weight.dtype) for m in layers.values()})
    if stored != [str(torch.bfloat16)]:
        raise CheckFailed(f"4-bit weights are not stored in bf16: {stored}")
    seen: Dict[str, torch.Tensor] = {}

    def hook(name):
        def pre(module, args):
            seen.setdefault(name, _words(module.weight))  # the first forward: the check's, before any step

        return pre

    trainable = trainable_names(model)
    reference = take_reference(model, synthetic_batch(ctx))
    if axis(params, "wrap", ("fsdp2", "fsdp2_root")) == "fsdp2":
        wrapped = fsdp2(model, ctx)
    else:
        wrapped = fully_shard(model, mesh=init_device_mesh(ctx.device.type, (ctx.world_size,))) or model
    handles = [m.register_forward_pre_hook(hook(n)) for n, m in layers.items()]
    try:
        checks = train_and_check(wrapped, ctx, trainable=trainable, reference=reference)
    finally:
        for h in handles:
            h.remove()
    changed = {}
    for name, words in seen.items():
        if words.shape != before[name].shape:
            changed[name] = f"{before[name].numel()} words before wrapping, {words.numel()} in the forward"
        elif not torch.equal(words, before[name]):
            diff = int((words != before[name]).sum())
            changed[name] = f"{diff} of {words.numel()} 16-bit words differ"
    checks["linear4bit_seen"] = f"{len(seen)}/{len(layers)}"
    checks["nan_words"] = sum(_nan_words(w) for w in before.values())
    checks["changed_words"] = changed
    if len(seen) != len(layers):
        raise CheckFailed(f"rank {ctx.rank}: the forward reached {len(seen)} of {len(layers)} Linear4bit layers")
    if changed:
        first = sorted(changed)[0]
        raise CheckFailed(
            f"rank {ctx.rank}: {len(changed)} Linear4bit weight(s) hold other bits in the wrapped forward than before "
            f"wrapping, first {first}: {changed[first]}"
        )
    return checks


if __name__ == "__main__":
    from fsdp_matrix.standalone import main

    main(run, CASE)
