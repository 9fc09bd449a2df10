"""A second adapter on a PEFT model with ranks > 0 on meta: https://github.com/huggingface/peft/issues/2834"""

from __future__ import annotations

import torch
from torch import distributed as dist

from fsdp_matrix.case import Failures, RankContext, axis, lora_config, main, peft_model, wrap_and_train

CASE = "second-adapter-meta"
HOWS = ("add_adapter", "add_adapter_meta", "load_adapter")
SECOND = "reference"


def _saved_first_adapter(model, ctx: RankContext) -> str:
    """Rank 0 (the only real weights) saves the first adapter; every rank then reads it from the shared scratch."""
    path = ctx.scratch / f"{CASE}-adapter-seed{ctx.seed}"
    failed = None
    if ctx.is_main:
        try:
            model.save_pretrained(str(path))
        except Exception as exc:  # reach the barrier, so the other ranks fail on the missing files, not hang
            failed = exc
    if dist.is_initialized():
        dist.barrier()
    if failed is not None:
        raise failed
    return str(path)


def misplaced(model, adapter: str) -> list:
    """``name (adapter device vs base device)`` for each weight of ``adapter`` not on its base layer's device."""
    out = []
    for name, module in model.named_modules():
        base = getattr(module, "base_layer", None)
        weight = getattr(base, "weight", None)
        if weight is None:
            continue
        for pname, param in module.named_parameters():
            if f".{adapter}." in f".{pname}" and param.device != weight.device:
                out.append(f"{name}.{pname} ({param.device} vs {weight.device})")
    return out


def check_placement(model, adapter: str, ctx: RankContext) -> None:
    """CheckFailed naming the rank and the tensors when any rank's new adapter is off its base layer's device."""
    local = misplaced(model, adapter)
    seen = [None] * ctx.world_size if dist.is_initialized() else [local]
    if dist.is_initialized():
        dist.all_gather_object(seen, local)
    failed = Failures()
    for rank, names in enumerate(seen):
        if names:
            failed.append(
                f"rank {rank}: {len(names)} weights of adapter {adapter!r} are not on their base layer's "
                f"device, e.g. {names[0]}"
            )
    failed.raise_if_any()


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    how = axis(params, "how", HOWS)
    model = peft_model(params, ctx, autocast=False)
    torch.manual_seed(ctx.seed + 1)
    if how == "add_adapter":
        model.add_adapter(SECOND, lora_config())
    elif how == "add_adapter_meta":
        on_meta = any(p.device.type == "meta" for p in model.parameters())
        model.add_adapter(SECOND, lora_config(), **({"low_cpu_mem_usage": True} if on_meta else {}))
    else:
        model.load_adapter(_saved_first_adapter(model, ctx), adapter_name=SECOND, is_trainable=False)
    model.set_adapter("default")
    devices = sorted({str(p.device) for n, p in model.named_parameters() if f".{SECOND}." in n})
    check_placement(model, SECOND, ctx)
    checks = wrap_and_train(model, params, ctx)
    return {"second_devices": devices, **checks}


if __name__ == "__main__":
    main(run, CASE)
