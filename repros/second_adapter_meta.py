"""peft#2834, trl#3371: a second adapter added to a PEFT model whose ranks > 0 hold meta weights (ram-efficient
loading), then FSDP.

Ram-efficient loading leaves ranks > 0 with the base and the first adapter on the meta device. A second adapter,
``add_adapter`` (peft#2834, "FSDP QLORA doesn't work with multiple adapters") or ``load_adapter`` of a saved one as
TRL's DPO docs recommend for the reference model (trl#3371), is built by PEFT on the CPU; PEFT's
``_move_adapter_to_device_of_base_layer`` then skips the whole adapter dict, because the first adapter in it is on
meta (``if any(p.device == meta for p in adapter_layer.parameters()): continue``), so on ranks > 0 the new adapter
is a real CPU tensor among meta ones. The attempted fix (peft PR #2836) was closed unmerged.

On CPU the stray tensor sits on the very device FSDP materializes to, so FSDP raises nothing and the broadcast
from rank 0 gives it rank 0's values (observed); the mismatch PEFT leaves is what the repro checks, before
wrapping, on every rank: every weight of the new adapter must be on its base layer's device. A CUDA run with two
GPUs would show what FSDP then does with a CPU tensor among meta ones on ranks > 0 (needs 2 GPUs; not run here).

Axes: ``init`` (``full``: every rank builds real weights, the control); ``how``: ``add_adapter``, ``load_adapter``,
or ``add_adapter_meta``, the workaround: on ranks whose base is on meta, ``add_adapter(..., low_cpu_mem_usage=True)``
builds the new adapter on meta like the rest (what the closed PR #2836 would have done; PEFT >= 0.13);
``wrap``/``orig``/``entry`` as everywhere. After the device check the model trains with every check: the first
adapter trains; the second is frozen and judged by the ranks-agree and forward checks.
"""

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
