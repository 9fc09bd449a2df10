"""A few AdamW steps on a fixed synthetic batch, then the checks that say whether training really worked."""

from __future__ import annotations

import time
from typing import Callable, Iterable, Optional

import torch
from torch import nn

from fsdp_matrix.workload.checks import TrainingChecks, require_fsdp
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.corruption import CorruptionChecks, ReferenceLike, as_reference
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
) -> None:
    """``steps`` optimizer steps on ``batch`` (labels = inputs); ``judge`` records each step's gradients and loss."""
    model.train()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids=batch, labels=batch).loss
        (backward or torch.Tensor.backward)(loss)
        if judge is not None:
            judge.record_grads(model)
        optimizer.step()
        if judge is not None:
            judge.record_loss(float(loss.detach()))


def train_and_check(
    model: nn.Module,
    ctx: RankContext,
    steps: int = 3,
    trainable: Optional[Iterable[str]] = None,
    *,
    optimizer: Optional[torch.optim.Optimizer] = None,
    backward: Optional[Callable[[torch.Tensor], None]] = None,
    reference: Optional[ReferenceLike] = None,
) -> dict:
    """Train ``steps`` AdamW steps on an FSDP-wrapped model, then check it (see checks.TrainingChecks.finish).

    The checks: the model is FSDP1 or FSDP2 (anything else, e.g. the DDP that accelerate falls back to on CPU, is a
    failure); the loss is finite every step; the trainable gradient norm is > 0 from step 1 on (``lora_B`` starts at
    zero, so ``lora_A`` has none at step 0); every trainable tensor got a non-zero gradient and changed; every other
    tensor is bit-identical. Then the silent-corruption checks of corruption.py: each rank holds what sharding
    promises (checked before any forward), every trainable tensor's piece changed on every rank, every
    parameter FSDP does not manage is identical on every rank, and, given a ``reference``, the wrapped model's logits
    before training equal the unwrapped model's.

    ``trainable``: the names of the parameters that require grad, taken from the PEFT model before wrapping
    (``trainable_names(model)``); when absent they are read from the wrapped model's per-parameter
    ``requires_grad``. ``optimizer``/``backward``: an optimizer and a backward function to use instead of a fresh
    AdamW(lr=1e-2) and ``loss.backward()`` (accelerate's prepared optimizer and ``accelerator.backward``).
    ``reference``: the unwrapped model's ``corruption.take_reference(model, synthetic_batch(ctx))`` taken before
    wrapping, its logits on ``synthetic_batch(ctx)``, or a callable ``batch -> logits``; without it the forward check
    does not run and the sharding check counts from the wrapped model's own dtypes (an upcast goes unseen).

    Raises CheckFailed naming every failed check with its measured value; returns the checks and values otherwise.
    Every collective runs before any check can raise, so a failed check cannot leave another rank waiting.
    """
    require_fsdp(model)
    batch = synthetic_batch(ctx)
    judge = TrainingChecks(trainable, ctx.device, ctx.world_size)
    judge.snapshot(model)
    params = [p for p in model.parameters() if p.requires_grad]
    own = optimizer is None
    optimizer = torch.optim.AdamW(params, lr=LR) if own else optimizer
    # the forward check after the snapshot (its summon_full_params lazily initializes FSDP1 before any forward, as
    # it always has: a forward first gives LoRA on expert parameters another error) and after the optimizer took
    # the parameters (after a forward without backward, FSDP2's root and FSDP1's SHARD_GRAD_OP units are left
    # unsharded, and model.parameters() lists unsharded copies or non-leaf views: observed, pytorch#149205)
    guard = CorruptionChecks(trainable, ctx.world_size, as_reference(reference, batch), batch)
    guard.after_wrap(model)
    start = time.perf_counter()
    train_steps(model, batch, steps, optimizer, backward, judge)
    train_s = time.perf_counter() - start
    if own:
        del optimizer
    found, failures = guard.after_training(model)
    extra = {"trainable_params_local": len(params), "train_s": round(train_s, 3), **found}
    return judge.finish(model, extra, failures)
