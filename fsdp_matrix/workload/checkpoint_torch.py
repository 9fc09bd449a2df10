"""Checkpoint save paths with torch and PEFT alone (no accelerate, no Trainer), each with the loader users pair it
with. The checks are in ``checkpoint``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Mapping, Tuple

import torch
from peft import PeftModel
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from fsdp_matrix.workload.adapters import is_adapter
from fsdp_matrix.workload.checkpoint import (
    barrier,
    dcp_load_here,
    gathered_adapter,
    logits,
    on_every_rank,
    read_adapter_dir,
    read_dcp,
    reload_and_check,
)
from fsdp_matrix.workload.checks import wrapper_kind
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.training import synthetic_batch


def write_adapter(peft_model: nn.Module, adapter_state: Mapping[str, torch.Tensor], out: Path) -> None:
    """An adapter directory as ``save_pretrained`` writes it: adapter_config.json + adapter_model.safetensors."""
    from safetensors.torch import save_file

    peft_model.peft_config["default"].save_pretrained(str(out))
    tensors = {k: v.detach().cpu().contiguous() for k, v in adapter_state.items()}
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})


def save_fsdp1_full(model: nn.Module, ctx: RankContext, out: Path) -> None:
    """FSDP1 ``FULL_STATE_DICT`` (rank 0 only), then ``get_peft_model_state_dict`` picks the adapter out of it.

    ``offload_to_cpu`` is what users set on GPU; on CPU it frees storage the state dict still uses and segfaults
    (torch's ``FlatParamHandle.to_cpu``, a CPU-only artifact), so it is off there.
    """
    from peft import get_peft_model_state_dict
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType

    config = FullStateDictConfig(offload_to_cpu=ctx.device.type != "cpu", rank0_only=True)
    with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
        state = model.state_dict()

    def write() -> None:
        if ctx.is_main:
            write_adapter(model.module, get_peft_model_state_dict(model.module, state_dict=state), out)

    on_every_rank(write)


def save_fsdp2_full(model: nn.Module, ctx: RankContext, out: Path) -> None:
    """FSDP2: ``get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))``
    (full tensors, on rank 0), then ``get_peft_model_state_dict``."""
    from peft import get_peft_model_state_dict
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def write() -> None:
        if ctx.is_main:
            write_adapter(model, get_peft_model_state_dict(model, state_dict=state), out)

    on_every_rank(write)


def save_sharded_dcp(model: nn.Module, ctx: RankContext, out: Path) -> None:
    """Sharded state through ``torch.distributed.checkpoint.save``: FSDP1 ``SHARDED_STATE_DICT``, or FSDP2's
    ``get_model_state_dict`` (DTensors). Every rank writes its own shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.fsdp import StateDictType

    if wrapper_kind(model) == "fsdp1":
        with FullyShardedDataParallel.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
            state = {"model": model.state_dict()}
    else:
        state = {"model": get_model_state_dict(model)}
    dcp.save(state, checkpoint_id=str(out / "dcp"))
    barrier()


def save_unwrapped(model: nn.Module, ctx: RankContext, out: Path) -> None:
    """``PeftModel.save_pretrained`` called on the unwrapped module on every rank, rank 0 writing (FSDP1: the
    root's ``module``; FSDP2: the model itself, which is the PeftModel)."""
    inner = model.module if isinstance(model, FullyShardedDataParallel) else model
    on_every_rank(lambda: inner.save_pretrained(str(out), is_main_process=ctx.is_main))


def load_dcp(build_peft: Callable[[], nn.Module], out: Path) -> nn.Module:
    """``dcp.load`` into a fresh PEFT model's own state dict tensors (in place), as users restore with DCP."""
    fresh = build_peft()
    state = {k: v for k, v in fresh.state_dict().items() if is_adapter(k)}
    dcp_load_here({"model": state}, out / "dcp")
    return fresh


@dataclass(frozen=True)
class RawPath:
    """One raw-torch save path."""

    save: Callable[[nn.Module, RankContext, Path], None]
    """Writes the checkpoint into the directory; called on every rank."""
    dcp: bool
    """True: a DCP checkpoint (read with DCP, loaded into a fresh PEFT model); False: an adapter directory (read
    as a file, loaded with ``PeftModel.from_pretrained`` on a fresh base)."""


RAW_PATHS: Dict[str, RawPath] = {
    "fsdp1_full": RawPath(save_fsdp1_full, dcp=False),
    "fsdp2_full": RawPath(save_fsdp2_full, dcp=False),
    "sharded_dcp": RawPath(save_sharded_dcp, dcp=True),
    "unwrapped_save_pretrained": RawPath(save_unwrapped, dcp=False),
}
"""The ``save`` axis values done with torch and PEFT alone."""


def raw_roundtrip(
    save: str,
    wrapped: nn.Module,
    ctx: RankContext,
    out: Path,
    builders: Tuple[Callable[[], nn.Module], Callable[[], nn.Module]],
    expected: Mapping[str, Tuple[int, ...]],
    dtype: torch.dtype,
) -> dict:
    """Gather the trained adapter and the FSDP logits, save by ``save``, read back, reload, check.

    ``builders`` make a fresh unwrapped base and a fresh PEFT model (same seed and config as the trained one);
    ``expected`` is every adapter tensor's full shape.
    """
    path = RAW_PATHS[save]
    build_base, build_peft = builders
    trained = gathered_adapter(wrapped)
    batch = synthetic_batch(ctx)
    fsdp_logits = logits(wrapped, batch)
    untrained = logits(build_peft(), batch)
    path.save(wrapped, ctx, out)

    def check() -> dict:
        if path.dcp:
            saved, reload = read_dcp(out / "dcp"), lambda: load_dcp(build_peft, out)
        else:
            saved, reload = read_adapter_dir(out), lambda: PeftModel.from_pretrained(build_base(), str(out))
        return reload_and_check(saved, reload, expected, trained, fsdp_logits, batch, dtype, untrained)

    return on_every_rank(check)
