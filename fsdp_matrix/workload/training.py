"""A few AdamW steps on a fixed synthetic batch, then the checks that say whether training really worked."""

from __future__ import annotations

import math
import time
from typing import Dict, List, Optional

import torch
from torch import distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import is_adapter
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.models import VOCAB

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch < 2.5
    from torch.distributed._tensor import DTensor

BATCH, SEQ = 2, 16
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def synthetic_batch(ctx: RankContext) -> torch.Tensor:
    """The same token ids on every rank and every run: (BATCH, SEQ) ids below VOCAB."""
    gen = torch.Generator().manual_seed(ctx.seed)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen).to(ctx.device)


def wrapper_kind(model: nn.Module) -> str:
    """``fsdp1``, ``fsdp2`` (parameters are DTensors) or ``none``."""
    if isinstance(model, FullyShardedDataParallel):
        return "fsdp1"
    if any(isinstance(p, DTensor) for p in model.parameters()):
        return "fsdp2"
    return "none"


def _clean(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    # compare raw storage: 4-bit weights are packed bytes (in uint8 or a float storage dtype) where float equality
    # is meaningless, and NaN != NaN would call an untouched tensor changed
    return tensor.detach().reshape(-1).contiguous().view(torch.uint8).cpu().clone()


def _resolve(model: nn.Module, name: str) -> torch.Tensor:
    obj = model
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def full_parameters(model: nn.Module, kind: str, names: Optional[List[str]] = None) -> Dict[str, torch.Tensor]:
    """Every parameter, unsharded, as raw bytes on CPU, by name. Collective under FSDP.

    Pass the names of an earlier call to read the same tensors again: after a forward, FSDP1 can hold a unit's
    unsharded views as plain tensor attributes that ``named_parameters`` no longer lists (seen at world size 1,
    where NO_SHARD never reshards), so they are looked up by attribute path instead.
    """
    if kind == "fsdp1":
        with FullyShardedDataParallel.summon_full_params(model, writeback=False):
            names = names or [n for n, _ in model.named_parameters()]
            return {n: _as_bytes(_resolve(model, n)) for n in names}
    out = {}
    for name in names or [n for n, _ in model.named_parameters()]:
        param = _resolve(model, name)
        out[name] = _as_bytes(param.full_tensor() if isinstance(param, DTensor) else param)
    return out


def _sum_over_ranks(value: float, device: torch.device) -> float:
    if not dist.is_initialized():
        return value
    # on the rank's own device: nccl only reduces CUDA tensors, gloo takes CPU ones
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item())


def grad_norm(params: List[nn.Parameter], device: torch.device) -> float:
    """L2 norm of the trainable gradients over all ranks (each rank holds its shard of them)."""
    local = 0.0
    for p in params:
        if p.grad is None:
            continue
        g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        local += float(g.detach().float().pow(2).sum())
    return math.sqrt(_sum_over_ranks(local, device))


def train_and_check(model: nn.Module, ctx: RankContext, steps: int = 3) -> dict:
    """Train ``steps`` AdamW steps, then check: loss finite every step, adapter gradients non-zero from step 1 on
    (``lora_B`` starts at zero, so ``lora_A`` has none at step 0), every frozen base tensor bit-identical, every
    adapter tensor changed.

    Raises CheckFailed naming every failed check with its measured value; returns the checks and values otherwise.
    Every collective runs before any check can raise, so a failed check cannot leave another rank waiting.
    """
    kind = wrapper_kind(model)
    before = full_parameters(model, kind)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    batch = synthetic_batch(ctx)
    model.train()
    losses, norms = [], []
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        norms.append(grad_norm(params, ctx.device))
        optimizer.step()
        losses.append(_sum_over_ranks(float(loss.detach()), ctx.device) / ctx.world_size)
    train_s = time.perf_counter() - start
    after = full_parameters(model, kind, list(before))
    del optimizer

    frozen = [n for n in before if not is_adapter(n)]
    adapters = [n for n in before if is_adapter(n)]
    frozen_changed = [_clean(n) for n in frozen if not torch.equal(before[n], after[n])]
    adapter_same = [_clean(n) for n in adapters if torch.equal(before[n], after[n])]
    checks = {
        "wrapper": kind,
        "steps": steps,
        "losses": losses,
        "grad_norms": norms,
        "trainable_params_local": len(params),
        "frozen_compared": len(frozen),
        "frozen_changed": frozen_changed,
        "adapter_tensors": len(adapters),
        "adapter_changed": len(adapters) - len(adapter_same),
        "train_s": round(train_s, 3),
    }
    failed = []
    if not all(math.isfinite(x) for x in losses):
        failed.append(f"loss not finite: {losses}")
    if not all(n > 0 and math.isfinite(n) for n in norms[1:]):
        failed.append(f"adapter grad norm not > 0 from step 1 on: {norms}")
    if not frozen:
        failed.append("no frozen base tensor to compare")
    if frozen_changed:
        failed.append(f"{len(frozen_changed)}/{len(frozen)} frozen base tensors changed: {frozen_changed[:5]}")
    if not adapters:
        failed.append("no adapter tensor found")
    if adapter_same:
        failed.append(f"{len(adapter_same)}/{len(adapters)} adapter tensors unchanged: {adapter_same[:5]}")
    if failed:
        raise CheckFailed("; ".join(failed))
    return checks
