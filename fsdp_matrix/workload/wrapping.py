"""FSDP wrapping of a (PEFT) model: FSDP1 with one of two auto-wrap policies, or FSDP2 ``fully_shard``."""

from __future__ import annotations

import functools
from typing import Callable, Optional

from peft.utils.other import fsdp_auto_wrap_policy
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.models import decoder_layer_class, decoder_layers

try:
    # torch >= 2.6 exports FSDP2 from torch.distributed.fsdp; earlier releases only from _composable
    from torch.distributed.fsdp import fully_shard
except ImportError:
    from torch.distributed._composable.fsdp import fully_shard

WRAPS = ("decoder_layer", "peft_policy", "fsdp2")
"""The wrap axis values of matrix.yaml."""


def fsdp1(model: nn.Module, policy: Optional[Callable], orig: bool, ctx: RankContext) -> FullyShardedDataParallel:
    """FSDP1, FULL_SHARD, with ``use_orig_params=orig`` and the given auto-wrap policy.

    ``device_id`` is always given: on CPU FSDP1 otherwise refuses to run ("FSDP needs a non-CPU accelerator
    device") before auto-wrapping, which would mask every error under test.
    """
    return FullyShardedDataParallel(
        model,
        auto_wrap_policy=policy,
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        use_orig_params=bool(orig),
        device_id=ctx.device,
    )


def fsdp2(model: nn.Module, ctx: RankContext) -> nn.Module:
    """``fully_shard`` on every decoder layer, then on the root, over a 1-D mesh of all ranks."""
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def decoder_layer_policy(model: nn.Module) -> Callable:
    """``transformer_auto_wrap_policy`` on the model's decoder-layer class: frozen base and LoRA in one unit."""
    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={decoder_layer_class(model)})


def wrap(model: nn.Module, wrap: str, orig: Optional[bool], ctx: RankContext) -> nn.Module:
    """Wrap for the ``wrap`` axis: ``decoder_layer`` / ``peft_policy`` (FSDP1, ``orig`` required) or ``fsdp2``."""
    if wrap == "fsdp2":
        return fsdp2(model, ctx)
    if orig is None:
        raise ValueError(f"wrap {wrap!r} is FSDP1 and needs the orig (use_orig_params) axis")
    if wrap == "decoder_layer":
        return fsdp1(model, decoder_layer_policy(model), orig, ctx)
    if wrap == "peft_policy":
        return fsdp1(model, fsdp_auto_wrap_policy(model), orig, ctx)
    raise ValueError(f"unknown wrap {wrap!r} (expected one of {', '.join(WRAPS)})")
