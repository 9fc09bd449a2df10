"""Scratch repro for test_corruption.py, run on 2 ranks: healthy models and deliberately corrupted ones through
``train_and_check`` with a reference, one scenario after another.

``torchrun --nproc-per-node 2 tests/workload/scratch_corruption.py OUT``: each rank writes ``OUT/rank<r>.json`` with
``{scenario: {"status": "ok" | "CheckFailed", "message": ..., "checks": {...}}}``.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from torch import distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
from torch.distributed.fsdp.wrap import CustomPolicy

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.checks import DTensor, trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.corruption import take_reference
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import decoder_layer_policy, wrap

LORA_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default"
LORA_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"
DOWN = "base_model.model.model.layers.0.mlp.down_proj"


class ScaledLinear(nn.Linear):
    """A linear whose weight carries its scale as an attribute of the Parameter, as bitsandbytes' ``Params4bit``
    carries its ``quant_state``: a wrapper that swaps the Parameter object drops it, and the forward changes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight * getattr(self.weight, "scale", 1.0), self.bias)


def _module(model: nn.Module, name: str) -> nn.Module:
    return functools.reduce(getattr, name.split("."), model)


def lora(ctx: RankContext, dtype: str = "fp32") -> nn.Module:
    return add_adapter(build_model("llama", dtype, ctx), "lora", seed=0, autocast=False)


def scaled(ctx: RankContext) -> nn.Module:
    model = lora(ctx)
    old = _module(model, DOWN)
    new = ScaledLinear(old.in_features, old.out_features, bias=False)
    new.weight = nn.Parameter(old.weight.detach().clone(), requires_grad=False)
    new.weight.scale = 2.0
    parent, leaf = DOWN.rsplit(".", 1)
    setattr(_module(model, parent), leaf, new)
    return model


def with_head_copy(ctx: RankContext) -> nn.Module:
    """LoRA with ``modules_to_save=["lm_head"]``: a trainable copy of the head, a parameter of FSDP2's root."""
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"])
    torch.manual_seed(0)
    return get_peft_model(build_model("llama", "fp32", ctx), config)


def fsdp1(model: nn.Module, ctx: RankContext, **kwargs) -> nn.Module:
    policy = decoder_layer_policy(model)
    return FullyShardedDataParallel(
        model, auto_wrap_policy=policy, use_orig_params=True, device_id=ctx.device, **kwargs
    )


def one_unit_unsharded(model: nn.Module, ctx: RankContext) -> nn.Module:
    """FULL_SHARD, but the policy gives decoder layer 0 NO_SHARD: one unit silently left whole on every rank."""
    layers = list(model.base_model.model.model.layers)

    def policy(module: nn.Module):
        if module is layers[0]:
            return {"sharding_strategy": ShardingStrategy.NO_SHARD}
        return module in layers

    return FullyShardedDataParallel(
        model, auto_wrap_policy=CustomPolicy(policy), use_orig_params=True, device_id=ctx.device
    )


def perturb_on_rank1(ctx: RankContext, model: nn.Module) -> Callable[[torch.Tensor], None]:
    """A backward that, on rank 1 after the first backward, nudges its own copy of the ignored (unmanaged) lora_A."""

    def backward(loss: torch.Tensor) -> None:
        loss.backward()
        if ctx.rank == 1 and not getattr(backward, "done", False):
            with torch.no_grad():
                _module(model, LORA_A.replace("base_model", "_fsdp_wrapped_module.base_model")).weight.add_(1e-3)
            backward.done = True

    return backward


def zero_rank1_grad(ctx: RankContext, model: nn.Module) -> Callable[[torch.Tensor], None]:
    """A backward that zeroes rank 1's shard of one lora_B gradient (zero at init: AdamW then leaves it at zero)."""

    def backward(loss: torch.Tensor) -> None:
        loss.backward()
        if ctx.rank == 1:
            grad = dict(model.named_parameters())[LORA_B].grad
            (grad.to_local() if isinstance(grad, DTensor) else grad).zero_()

    return backward


def scenario(ctx: RankContext, name: str) -> Dict:
    base = lora(ctx, "bf16") if name in ("bf16", "upcast") else scaled(ctx) if name.startswith("scaled") else lora(ctx)
    if name == "forward_first":
        base = with_head_copy(ctx)
    trainable = trainable_names(base)
    reference = take_reference(base, synthetic_batch(ctx))
    backward: Optional[Callable] = None
    if name in ("fsdp2", "bf16", "scaled_fsdp2", "untrained_shard"):
        wrapped = wrap(base, "fsdp2", None, ctx)
    elif name == "forward_first":
        # pytorch#149205: a forward before the optimizer is built leaves FSDP2's root unsharded, and the optimizer
        # train_and_check builds then holds plain copies of the root's parameters, not the sharded ones
        wrapped = wrap(base, "fsdp2", None, ctx)
        with torch.no_grad():
            wrapped(input_ids=synthetic_batch(ctx))
    elif name == "upcast":
        wrapped = wrap(base.float(), "fsdp2", None, ctx)  # as prepare_model_for_kbit_training upcasts bf16 weights
    elif name in ("fsdp1", "scaled_fsdp1"):
        wrapped = wrap(base, "decoder_layer", True, ctx)
    elif name == "unsharded_unit":
        wrapped = one_unit_unsharded(base, ctx)
    else:  # ignored, ranks_disagree: one LoRA leaf FSDP never manages, a plain tensor on each rank
        wrapped = fsdp1(base, ctx, ignored_modules=[_module(base, LORA_A)])
    if name == "ranks_disagree":
        backward = perturb_on_rank1(ctx, wrapped)
    if name == "untrained_shard":
        backward = zero_rank1_grad(ctx, wrapped)
    try:
        checks = train_and_check(wrapped, ctx, trainable=trainable, backward=backward, reference=reference)
    except CheckFailed as exc:
        return {"status": "CheckFailed", "message": str(exc)}
    keep = ("bytes_per_rank", "bytes_promised", "shard_group", "forward_max_diff", "shards_changed", "shards_empty")
    return {"status": "ok", "checks": {k: checks[k] for k in keep + ("unmanaged_tensors",)}}


SCENARIOS = (
    "fsdp2",
    "fsdp1",
    "bf16",
    "ignored",
    "ranks_disagree",
    "scaled_fsdp2",
    "scaled_fsdp1",
    "upcast",
    "unsharded_unit",
    "untrained_shard",
    "forward_first",
)


def main(out: Path, names) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ctx = RankContext(rank, dist.get_world_size(), rank, torch.device("cpu"), "gloo", out)
    outcomes = {name: scenario(ctx, name) for name in names or SCENARIOS}
    (out / f"rank{rank}.json").write_text(json.dumps(outcomes, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
