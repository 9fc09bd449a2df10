"""A few AdamW steps on a fixed synthetic batch, then the checks that say whether training really worked."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterable, Mapping, Optional

import torch
from torch import nn

from fsdp_matrix.workload.checks import TrainingChecks, require_fsdp
from fsdp_matrix.workload.collectives import CollectiveSpy, fsdp_unit_modules, judge_counts, promise_of
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.corruption import CorruptionChecks, ReferenceLike, as_reference
from fsdp_matrix.workload.knobs import CompileProbe, Loop, micro_batches
from fsdp_matrix.workload.models import VOCAB

BATCH, SEQ = 2, 16


LR = 1e-2
"""AdamW's learning rate in every training run of a cell."""


def synthetic_batch(ctx: RankContext) -> torch.Tensor:
    """The same token ids on every rank and every run: (BATCH, SEQ) ids below VOCAB."""
    gen = torch.Generator().manual_seed(ctx.seed)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen).to(ctx.device)


def train_steps(
    model: nn.Module,
    batch: torch.Tensor,
    steps: int,
    optimizer: torch.optim.Optimizer,
    backward: Optional[Callable[[torch.Tensor], None]] = None,
    judge: Optional[TrainingChecks] = None,
    loop: Optional[Loop] = None,
    spy: Optional[CollectiveSpy] = None,
) -> None:
    """``steps`` optimizer steps on ``batch`` (labels = inputs); ``judge`` records each step's gradients and loss.

    ``loop`` (knobs.py): the micro-steps of one optimizer step (``accum``), each in the entry's sync context, and
    the entry's clip; ``spy`` (collectives.py) closes its count at each optimizer step and leaves out the judge's
    own collectives."""
    loop = loop or Loop()
    quiet = spy.paused if spy is not None else contextlib.nullcontext
    model.train()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        chunks = micro_batches(batch, loop.knobs.accum)
        step_loss = 0.0
        for i, chunk in enumerate(chunks):
            with loop.micro(model, i == len(chunks) - 1):
                loss = model(input_ids=chunk, labels=chunk).loss
                (backward or torch.Tensor.backward)(loss / len(chunks) if loop.scale else loss)
            step_loss += float(loss.detach()) / len(chunks)
        if loop.knobs.clip is not None:
            loop.clip(model, loop.knobs.clip)
        if judge is not None:
            with quiet():
                judge.record_grads(model)
        optimizer.step()
        if spy is not None:
            spy.step()
        if judge is not None:
            with quiet():
                judge.record_loss(step_loss)


def train_and_check(
    model: nn.Module,
    ctx: RankContext,
    steps: int = 3,
    trainable: Optional[Iterable[str]] = None,
    *,
    optimizer: Optional[torch.optim.Optimizer] = None,
    backward: Optional[Callable[[torch.Tensor], None]] = None,
    reference: Optional[ReferenceLike] = None,
    loop: Optional[Loop] = None,
    params: Optional[Mapping[str, Any]] = None,
    entry: Optional[Mapping[str, Any]] = None,
) -> dict:
    """Train ``steps`` AdamW steps on an FSDP-wrapped model, then check it (see checks.TrainingChecks.finish).

    The checks: the model is FSDP1 or FSDP2 (not DDP) in the world the cell was promised; the loss is finite; the
    trainable gradient norm is > 0 from step 1 on; every trainable tensor got a gradient and changed, every other is
    bit-identical. Then corruption.py's (sharding, shards trained, ranks agree, forward against a ``reference``),
    units.py's structure, dtypes.py's promise, collectives.py's counts; a ``compile`` cell compiled something.

    ``trainable``: the names of the parameters that require grad, taken from the PEFT model before wrapping
    (``trainable_names(model)``); when absent they are read from the wrapped model's per-parameter
    ``requires_grad``. ``optimizer``/``backward``: an optimizer and a backward function to use instead of a fresh
    AdamW(lr=1e-2) and ``loss.backward()`` (accelerate's prepared optimizer and ``accelerator.backward``).
    ``reference``: the unwrapped model's ``corruption.take_reference(model, synthetic_batch(ctx))`` taken before
    wrapping, its logits on ``synthetic_batch(ctx)``, or a callable ``batch -> logits``; without it the forward check
    does not run and the sharding check counts from the wrapped model's own dtypes (an upcast goes unseen).
    ``loop``: the knobs as the entry runs them (default: the ``torch`` entry's for ``params``, knobs.Loop); ``params``:
    the cell's, whose ``wrap`` and ``shard`` promise the collectives in ``checks["collectives"]`` (collectives.py).
    ``entry``: the entry's ``mixed_precision`` and ``checkpointing`` settings, for units.py's and dtypes.py's checks.

    Raises CheckFailed naming every failed check with its measured value; returns the checks and values otherwise.
    Every collective runs before any check can raise, so a failed check cannot leave another rank waiting.
    """
    require_fsdp(model)
    batch = synthetic_batch(ctx)
    judge = TrainingChecks(trainable, ctx.device, ctx.world_size)
    judge.snapshot(model)
    params_list = [p for p in model.parameters() if p.requires_grad]
    own = optimizer is None
    optimizer = torch.optim.AdamW(params_list, lr=LR) if own else optimizer
    # the forward check after the snapshot (its summon_full_params lazily initializes FSDP1 before any forward, as
    # it always has: a forward first gives LoRA on expert parameters another error) and after the optimizer took
    # the parameters (after a forward without backward, FSDP2's root and FSDP1's SHARD_GRAD_OP units are left
    # unsharded, and model.parameters() lists unsharded copies or non-leaf views: observed, pytorch#149205)
    loop = loop or Loop.for_torch(params or {})
    compiled = CompileProbe.start(loop.knobs)  # before the forward check, the cell's first forward of this model
    guard = CorruptionChecks(trainable, ctx.world_size, as_reference(reference, batch), batch, params, entry)
    guard.after_wrap(model)
    spy, units = spy_on(model)
    start = time.perf_counter()
    with spy.spying():
        train_steps(model, batch, steps, optimizer, backward, judge, loop, spy)
    train_s = time.perf_counter() - start
    found, failures = guard.after_training(model, optimizer)
    del optimizer
    counted, broken = judge_collectives(spy, units, model, params, ctx.world_size, loop.knobs.accum)
    frames, uncompiled = compiled.judge()
    extra = {"trainable_params_local": len(params_list), "train_s": round(train_s, 3), **found, **frames}
    return judge.finish(model, {**extra, "collectives": counted}, [*failures, *broken, *uncompiled])


def spy_on(model: nn.Module) -> tuple:
    """A CollectiveSpy naming ``model``'s FSDP units, and those units (collectives.fsdp_unit_modules)."""
    units = fsdp_unit_modules(model)
    return CollectiveSpy({id(m): name for name, (m, _, _) in units.items()}), units


def judge_collectives(
    spy: CollectiveSpy,
    units: dict,
    model: nn.Module,
    params: Optional[Mapping[str, Any]],
    world_size: int,
    micro_steps: int,
) -> tuple:
    """collectives.judge against what the cell's ``wrap`` and ``shard`` promise (no ``params``: the units found, and
    the strategy they run taken as asked)."""
    shard = None if params is None else str(params.get("shard", "full"))
    promise = promise_of(model, (params or {}).get("wrap"), world_size, shard)
    return judge_counts(spy, units, promise, micro_steps)
