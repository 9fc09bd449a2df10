"""peft PR #3251: ``save_pretrained`` called on the PEFT model inside FSDP, without gathering the shards first.

A user (or a library) unwraps the FSDP model (``model.module``, ``accelerator.unwrap_model``) and calls
``save_pretrained`` on what it gets, with no ``FULL_STATE_DICT`` context and no state dict of its own. Nothing raises
where the adapter is written wrong: the file looks valid and a loader fails later (vLLM, transformers). PR #3251
(peft 0.21.0) adds a ``PeftWarning`` for LoRA tensors of impossible shape; the shards are still written.

Axis ``wrap`` (how the trained model is sharded when it is saved; ``use_orig_params=True``):

- ``root_only``: FSDP1 with no auto-wrap policy: the whole model is one unit, and outside its forward every LoRA
  weight is this rank's 1-D slice of the flat parameter. This is what PR #3251 warns about.
- ``peft_policy``: PEFT's ``fsdp_auto_wrap_policy`` (what the Trainer uses for PEFT models): nested FSDP1 units,
  whose ``state_dict`` hooks gather each unit, so this path writes full tensors on older peft (observed). peft
  0.21's structural key selection (PR #3490) does not see through the nested ``_fsdp_wrapped_module`` names and
  selects nothing (observed). The same path with the decoder-layer policy and with FSDP2 is in the
  ``checkpoint-roundtrip`` case (``save: unwrapped_save_pretrained``).

After 3 training steps (the usual checks), every rank calls ``save_pretrained`` on the inner model (rank 0 writes),
then every rank reads the written file back: each adapter tensor must be there, with its full shape and the trained
values. CheckFailed names each tensor that is not, with both shapes, and says whether peft warned.
"""

from __future__ import annotations

import warnings

from torch import distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.checkpoint import (
    cell_dir,
    check_saved,
    full_shapes,
    gathered_adapter,
    on_every_rank,
    read_adapter_dir,
)
from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.params import axis, flag
from fsdp_matrix.workload.recipe import peft_model
from fsdp_matrix.workload.training import train_and_check
from fsdp_matrix.workload.wrapping import WRAPS, fsdp1, wrap

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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
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
    from fsdp_matrix.standalone import main

    main(run, CASE)
