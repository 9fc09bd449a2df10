"""FSDP wrapping of a (PEFT) model: FSDP1 with one of two auto-wrap policies, or FSDP2 ``fully_shard``."""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Optional

import torch
from peft.utils.other import fsdp_auto_wrap_policy
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.meta_init import FROM_RANK0, INITS, cpu_sync_module_states, fsdp1_kwargs, fsdp2_from_rank0
from fsdp_matrix.workload.models import decoder_layer_class, decoder_layers

try:
    # torch >= 2.6 exports FSDP2 from torch.distributed.fsdp; earlier releases only from _composable
    from torch.distributed.fsdp import fully_shard
except ImportError:
    from torch.distributed._composable.fsdp import fully_shard

WRAPS = ("decoder_layer", "peft_policy", "fsdp2")
"""The ``wrap`` values ``wrap()`` takes (repros with other wraps, e.g. ``root``, build them themselves)."""

SHARDING = {
    "full": ShardingStrategy.FULL_SHARD,
    "grad_op": ShardingStrategy.SHARD_GRAD_OP,
    "none": ShardingStrategy.NO_SHARD,
}
"""The ``shard`` axis (FSDP1 only; absent: full): how much of a unit stays sharded between its forward and backward."""

MIXED_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The ``mp`` axis (FSDP1 only; absent: none): a ``MixedPrecision`` policy computing in this dtype."""


def fsdp1(
    model: nn.Module,
    policy: Optional[Callable],
    orig: bool,
    ctx: RankContext,
    *,
    shard: str = "full",
    mp: Optional[str] = None,
    init: str = "full",
) -> FullyShardedDataParallel:
    """FSDP1 with ``use_orig_params=orig``, the given auto-wrap policy, a sharding strategy (``SHARDING``, default
    FULL_SHARD) and optionally a ``MixedPrecision`` policy (``MIXED_PRECISION``).

    ``device_id`` is always given: on CPU FSDP1 otherwise refuses to run ("FSDP needs a non-CPU accelerator
    device") before auto-wrapping, which would mask every error under test. ``init`` ``ram_efficient``: rank 0
    holds the weights, the other ranks meta tensors; ``sync_module_states=True`` and a ``to_empty`` ``param_init_fn``
    (meta_init.py; on CPU with torch's GPU-only check of the states lifted, ``cpu_sync_module_states``).
    """
    if shard not in SHARDING:
        raise ValueError(f"unknown shard {shard!r} (expected one of {', '.join(SHARDING)})")
    if mp is not None and mp not in MIXED_PRECISION:
        raise ValueError(f"unknown mp {mp!r} (expected one of {', '.join(MIXED_PRECISION)})")
    policy_mp = None
    if mp is not None:
        dtype = MIXED_PRECISION[mp]
        policy_mp = MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype)
    low_mem = _init(init) in FROM_RANK0
    with cpu_sync_module_states(ctx.device) if low_mem else contextlib.nullcontext([]):
        return FullyShardedDataParallel(
            model,
            auto_wrap_policy=policy,
            sharding_strategy=SHARDING[shard],
            mixed_precision=policy_mp,
            use_orig_params=bool(orig),
            device_id=ctx.device,
            **(fsdp1_kwargs(ctx) if low_mem else {}),
        )


def device_mesh(ctx: RankContext) -> DeviceMesh:
    """The 1-D mesh of all ranks on the cell's device type, as ``fsdp2`` shards over it."""
    return init_device_mesh(ctx.device.type, (ctx.world_size,))


def fsdp2(model: nn.Module, ctx: RankContext, init: str = "full", *, per_layer: bool = True) -> nn.Module:
    """``fully_shard`` on every decoder layer, then on the root, over a 1-D mesh of all ranks (``per_layer`` False:
    on the root only, so every parameter is in one unit).

    ``init`` ``ram_efficient``: rank 0's state dict, taken before sharding, is broadcast into the sharded model
    (meta_init.fsdp2_from_rank0)."""
    full_sd = model.state_dict() if _init(init) in FROM_RANK0 and ctx.is_main else {}
    mesh = device_mesh(ctx)
    for layer in decoder_layers(model) if per_layer else []:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if init in FROM_RANK0:
        fsdp2_from_rank0(model, full_sd, ctx)
    return model


def _init(init: str) -> str:
    if init not in INITS:
        raise ValueError(f"unknown init {init!r} (expected one of {', '.join(INITS)})")
    return init


def decoder_layer_policy(model: nn.Module) -> Callable:
    """``transformer_auto_wrap_policy`` on the model's decoder-layer class: frozen base and LoRA in one unit."""
    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={decoder_layer_class(model)})


def wrap(
    model: nn.Module,
    wrap: str,
    orig: Optional[bool],
    ctx: RankContext,
    *,
    shard: str = "full",
    mp: Optional[str] = None,
    init: str = "full",
) -> nn.Module:
    """Wrap for the ``wrap`` axis: ``decoder_layer`` / ``peft_policy`` (FSDP1, ``orig`` required; ``shard`` and ``mp``
    as in ``fsdp1``) or ``fsdp2``; ``init`` as in ``fsdp1`` / ``fsdp2``."""
    if wrap == "fsdp2":
        if shard != "full" or mp is not None:
            raise ValueError("the shard and mp axes are FSDP1 settings; fsdp2 cells take neither")
        return fsdp2(model, ctx, init=init)
    if orig is None:
        raise ValueError(f"wrap {wrap!r} is FSDP1 and needs the orig (use_orig_params) axis")
    if wrap == "decoder_layer":
        return fsdp1(model, decoder_layer_policy(model), orig, ctx, shard=shard, mp=mp, init=init)
    if wrap == "peft_policy":
        return fsdp1(model, fsdp_auto_wrap_policy(model), orig, ctx, shard=shard, mp=mp, init=init)
    raise ValueError(f"unknown wrap {wrap!r} (expected one of {', '.join(WRAPS)})")
