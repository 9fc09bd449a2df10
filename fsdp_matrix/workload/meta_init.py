"""The ``init`` axis: how each rank gets the weights before FSDP shards them.

- ``full`` (also a cell without the axis): every rank builds the same weights (models.build_model).
- ``ram_efficient``: only rank 0 holds real weights. It saves the tiny model once to ``ctx.scratch`` and loads it back
  with ``from_pretrained(..., low_cpu_mem_usage=True)``, as users load a checkpoint; every other rank builds the model
  under accelerate's ``init_empty_weights()`` (parameters on the meta device, buffers real, as transformers' own
  low-memory load does). The weights reach ranks > 0 only through FSDP, set the way each entry sets it:

  - torch FSDP1: ``sync_module_states=True`` with ``param_init_fn`` calling ``to_empty(recurse=False)`` (wrapping.py);
  - torch FSDP2: ``fully_shard`` on the meta model, ``to_empty`` on the modules that still hold meta tensors, then
    ``set_model_state_dict(..., full_state_dict=True, broadcast_from_rank0=True)`` from rank 0's state dict, and
    every buffer broadcast from rank 0 (``fsdp2_from_rank0``);
  - accelerate: ``FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True, sync_module_states=True)``
    (entry.py; on CPU with part (E) of the shim, cpu_shim.py).

On CPU, FSDP1 refuses ``sync_module_states=True`` before it broadcasts anything (``ValueError: The module has CPU
parameters or buffers when `sync_module_states=True`, which requires them to be on GPU``, torch 2.13.0, observed):
a check only, since gloo broadcasts CPU tensors. ``cpu_sync_module_states`` lifts that one check for the FSDP1
constructor on CPU, and says so (``SYNC_SHIM``, in the cell's ``checks["shim"]``); on GPU it does nothing.

The reference of the forward and sharding checks must come from real weights, never from meta:
``reference_for`` takes it on rank 0 and broadcasts it to every rank.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any, Callable, Dict, Iterator, Mapping, Optional

import torch
from accelerate import init_empty_weights
from torch import distributed as dist
from torch import nn

from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.corruption import Reference, take_reference
from fsdp_matrix.workload.models import _config, _dtype_kwarg, build_model, torch_dtype
from fsdp_matrix.workload.params import axis

INITS = ("full", "ram_efficient", "launcher")
"""The ``init`` axis values of matrix.yaml; a cell without the axis is ``full``."""
FROM_RANK0 = ("ram_efficient", "launcher")
"""The ``init`` values where only rank 0 is sure to hold real weights, and FSDP sends them to the other ranks
(``launcher``: transformers decides what ranks > 0 hold, launcher.py)."""

META = torch.device("meta")


def init_of(params: Mapping[str, Any]) -> str:
    """The cell's ``init`` (``full`` when the axis is absent); UnknownAxisValue for another value."""
    return axis(params, "init", INITS, default="full")


def ram_efficient(params: Mapping[str, Any]) -> bool:
    """True for ``init: ram_efficient`` and ``init: launcher``: the weights reach ranks > 0 through FSDP."""
    return init_of(params) in FROM_RANK0


def has_meta(module: nn.Module, recurse: bool = True) -> bool:
    """Whether any parameter or buffer of ``module`` is on the meta device."""
    tensors = list(module.parameters(recurse=recurse)) + list(module.buffers(recurse=recurse))
    return any(t.device == META for t in tensors)


def materialize_trainable(model: nn.Module, device: torch.device) -> int:
    """``to_empty`` on ``device`` for every module whose own trainable parameters are on meta (axolotl PR #3977's fix
    of ram-efficient loading, https://github.com/axolotl-ai-cloud/axolotl/pull/3977: the LoRA weights of ranks > 0
    get real storage, which FSDP's broadcast from rank 0 then fills); returns how many modules."""
    count = 0
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if own and has_meta(module, recurse=False):
            module.to_empty(device=device, recurse=False)
            count += 1
    return count


def meta_names(module: nn.Module) -> list:
    """Names of the parameters on the meta device."""
    return [n for n, p in module.named_parameters() if p.device == META]


def build_rank0_model(name: str, dtype: str, ctx: RankContext) -> nn.Module:
    """Rank 0: the tiny model saved once and loaded back with ``low_cpu_mem_usage=True``; other ranks: the same
    architecture under ``init_empty_weights()`` (parameters on meta), in ``dtype``."""
    config, cls = _config(name)
    path = ctx.scratch / f"{name}-{dtype}-seed{ctx.seed}-full"
    failed = None
    if ctx.is_main and not (path / "config.json").exists():
        try:
            build_model(name, dtype, replace(ctx, device=torch.device("cpu"))).save_pretrained(path)
        except Exception as exc:  # reach the barrier anyway, so the other ranks do not hang
            failed = exc
    if dist.is_initialized():
        dist.barrier()
    if failed is not None:
        raise failed
    if ctx.is_main:
        kwargs = {_dtype_kwarg(): torch_dtype(dtype), "low_cpu_mem_usage": True}
        return cls.from_pretrained(path, **kwargs).to(ctx.device)
    with init_empty_weights():
        model = cls(config)
    return model.to(dtype=torch_dtype(dtype))


def reference_for(
    model: nn.Module,
    batch: torch.Tensor,
    ctx: RankContext,
    params: Mapping[str, Any],
    source: Optional[Callable[[], nn.Module]] = None,
) -> Reference:
    """The forward/sharding reference: taken on every rank for ``full``; for ``ram_efficient`` and ``launcher``
    taken on rank 0 and broadcast, so ranks > 0 never compare against a meta model. ``source`` builds the model rank
    0 takes it from (default: ``model``, rank 0's real weights; ``launcher``: the checkpoint loaded plainly, since
    the launched rank 0 may itself hold placeholders). Collective for both."""
    if not ram_efficient(params) or not dist.is_initialized():
        return _reference_from(model, source, batch)
    box = [_reference_from(model, source, batch) if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _reference_from(model: nn.Module, source: Optional[Callable[[], nn.Module]], batch: torch.Tensor) -> Reference:
    if source is None:
        return take_reference(model, batch)
    try:
        built = source()
    except Exception as exc:  # noqa: BLE001 - rank 0 must reach the broadcast; the forward check records why not
        return Reference(error=f"{type(exc).__name__} building the reference: {str(exc)[:200]}")
    return take_reference(built, batch)


def fsdp1_kwargs(ctx: RankContext) -> Dict[str, Any]:
    """FSDP1's ram-efficient settings: broadcast rank 0's states, and give ranks > 0 storage for their meta modules
    (what accelerate's plugin passes, with this rank's device)."""
    device = ctx.device
    return {"sync_module_states": True, "param_init_fn": lambda m: m.to_empty(device=device, recurse=False)}


SYNC_SHIM = "(F) FSDP1 sync_module_states on CPU: torch's GPU-only check of the module states is lifted (gloo)"
"""The line a cell records when ``cpu_sync_module_states`` took effect."""


@contextlib.contextmanager
def cpu_sync_module_states(device: torch.device) -> Iterator[list]:
    """Lift FSDP1's "CPU parameters with sync_module_states" check inside the block, on CPU only; yields the lines
    to record (``SYNC_SHIM`` when applied, nothing on GPU)."""
    if device.type != "cpu":
        yield []
        return
    from torch.distributed.fsdp import _init_utils

    original = getattr(_init_utils, "_check_module_states_for_sync_module_states", None)
    if original is None:  # a torch without the check: nothing to lift
        yield []
        return
    _init_utils._check_module_states_for_sync_module_states = lambda states: None
    try:
        yield [SYNC_SHIM]
    finally:
        _init_utils._check_module_states_for_sync_module_states = original


def fsdp2_from_rank0(model: nn.Module, full_sd: Dict[str, torch.Tensor], ctx: RankContext) -> None:
    """After ``fully_shard``: storage for ranks > 0's meta tensors, then rank 0's state dict and buffers. Collective.

    ``full_sd``: rank 0's ``model.state_dict()`` taken before ``fully_shard`` (empty on the other ranks).
    Non-persistent buffers (e.g. the rotary ``inv_freq``) are not in a state dict: they are broadcast as FSDP1's
    ``sync_module_states`` does.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    for module in model.modules():
        if has_meta(module, recurse=False):
            module.to_empty(device=ctx.device, recurse=False)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full_sd if ctx.is_main else {}, options=options)
    for buffer in model.buffers():
        dist.broadcast(buffer.data, src=0)
