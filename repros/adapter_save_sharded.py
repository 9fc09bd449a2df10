"""save_pretrained inside FSDP without gathering: https://github.com/huggingface/peft/pull/3251"""

from __future__ import annotations

from torch import distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from fsdp_matrix.case import (
    WRAPS,
    CheckFailed,
    RankContext,
    axis,
    caught_warnings,
    cell_dir,
    check_saved,
    flag,
    fsdp1,
    full_shapes,
    gathered_adapter,
    main,
    on_every_rank,
    peft_model,
    read_adapter_dir,
    train_and_check,
    trainable_names,
    wrap,
)

CASE = "adapter-save-sharded"

WARNING_MARKERS = ("invalid shape", "shard")
"""Words of peft's warning about unsharded LoRA tensors (PR #3251: "LoRA tensor(s) have invalid shape")."""


def wrap_for(model: nn.Module, params: dict, ctx: RankContext) -> nn.Module:
    """``root_only`` (FSDP1 with no auto-wrap policy: one unit) or a wrap of wrapping.py."""
    orig, kind = flag(params, "orig", default=None), axis(params, "wrap", ("root_only", *WRAPS))
    if kind == "root_only":
        return fsdp1(model, None, bool(orig), ctx)
    return wrap(model, kind, orig, ctx)


def _shared(value, ctx: RankContext):
    # rank 0's value on every rank, so every rank judges (and words its failure) the same way
    if not dist.is_initialized():
        return value
    box = [value if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def save_without_gathering(wrapped: nn.Module, ctx: RankContext, out) -> list:
    """``save_pretrained`` on the inner PEFT model on every rank, rank 0 writing; returns rank 0's peft warnings
    about LoRA shapes."""
    inner = wrapped.module if isinstance(wrapped, FullyShardedDataParallel) else wrapped
    with caught_warnings() as caught:
        on_every_rank(lambda: inner.save_pretrained(str(out), is_main_process=ctx.is_main))
    found = [
        f"{w.category.__name__}: {str(w.message).splitlines()[0][:200]}"
        for w in caught
        if any(m in str(w.message) for m in WARNING_MARKERS) and "LoRA" in str(w.message)
    ]
    return _shared(found, ctx)


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    model = peft_model({"adapter": "lora", **params}, ctx)
    expected = full_shapes(model)
    trainable = trainable_names(model)
    wrapped = wrap_for(model, params, ctx)
    checks = train_and_check(wrapped, ctx, trainable=trainable)
    trained = gathered_adapter(wrapped)
    with cell_dir(ctx, params) as out:
        peft_warnings = save_without_gathering(wrapped, ctx, out)
        checks["peft_warnings"] = peft_warnings
        try:
            # on every rank, and every rank meets the others before the directory goes
            checks.update(on_every_rank(lambda: check_saved(read_adapter_dir(out), expected, trained)))
        except CheckFailed as exc:
            said = f"peft warned: {peft_warnings[0]}" if peft_warnings else "no warning from peft"
            raise CheckFailed(f"{exc} ({said})") from None
    return checks


if __name__ == "__main__":
    main(run, CASE)
