"""FSDP2 on Linear4bit with bf16 quant storage: https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1945"""

from __future__ import annotations

from typing import Dict

import torch

from fsdp_matrix.case import (
    CheckFailed,
    DTensor,
    RankContext,
    axis,
    fsdp2,
    linear4bit_layers,
    main,
    peft_model,
    synthetic_batch,
    take_reference,
    train_and_check,
    trainable_names,
)

CASE = "fsdp2-4bit-forward"


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
    layers = linear4bit_layers(model)
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
    wrapped = fsdp2(model, ctx, per_layer=axis(params, "wrap", ("fsdp2", "fsdp2_root")) == "fsdp2")
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
    main(run, CASE)
