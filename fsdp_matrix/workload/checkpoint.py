"""Checkpoint round trips under FSDP: save the trained adapter by a path users use, reload it into a fresh,
unwrapped model, and check that nothing was lost on the way.

Every failure here is silent in the libraries (a 1-D or empty shard written, only rank 0's slice written, nothing
written, a resume that restarts from init): the checks below are what turn it into an observed error. Each one
raises ``CheckFailed`` with a message that names the tensor and the two shapes or values that disagree.

Tolerances (``TOLERANCE``): a saved or reloaded adapter tensor must equal the trained one exactly (a checkpoint is a
copy). Logits of the reloaded model, and adapters after a resume, must match within a per-dtype tolerance: fp32 uses
torch.testing's defaults (rtol 1.3e-6, atol 1e-5), observed bit-identical on CPU; bf16 and fp16 use about two units
in the last place at the logits' scale (bf16 rtol = atol = 1.6e-2, fp16 1e-3), because ``PeftModel.from_pretrained``
upcasts a half-precision adapter to fp32 by default (``autocast_adapter_dtype``), so the reloaded model legitimately
computes the adapter in fp32 where the trained one used bf16: observed max |diff| 0.0039 (one bf16 ulp at 0.5) on
logits up to 0.59, 0 with the adapter kept in bf16. The logits of the same model with an untrained adapter differ by
about 0.58, far outside every tolerance (recorded as ``logits_gap_untrained``).
"""

from __future__ import annotations

import contextlib
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
from torch import distributed as dist
from torch import nn
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import is_adapter
from fsdp_matrix.workload.checks import DTensor, wrapper_kind
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.corruption import LOGITS_TOLERANCE

TOLERANCE = LOGITS_TOLERANCE
"""dtype -> (rtol, atol) for logits and resumed weights (see the module docstring for why); the forward check of
corruption.py uses the same values."""

_WRAPPERS = re.compile(r"(_fsdp_wrapped_module|_checkpoint_wrapped_module|_orig_mod|_forward_module)\.")
_ADAPTER_NAME = re.compile(r"\.(lora_[A-Za-z_]+)\.default(?=\.|$)")


def adapter_key(name: str) -> str:
    """One spelling for an adapter tensor wherever it comes from: wrapper infixes and PEFT's adapter name dropped,
    e.g. ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` (what ``adapter_model.safetensors``
    holds)."""
    return _ADAPTER_NAME.sub(r".\1", _WRAPPERS.sub("", name))


def _shape(tensor: Any) -> Tuple[int, ...]:
    # torch.save of a DTensor keeps only this rank's local shard: that is what is in the file
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return tuple(local.shape)


@dataclass
class Saved:
    """What a save path wrote, read back from disk."""

    where: str
    """The file or directory, for messages."""
    shapes: Dict[str, Tuple[int, ...]]
    """Adapter key -> the shape stored on disk (a DTensor's local shard; DCP's recorded global size)."""
    tensors: Dict[str, torch.Tensor] = field(default_factory=dict)
    """Adapter key -> the stored values, where they can be read as a whole."""


def saved_from_state_dict(state_dict: Mapping[str, Any], where: str) -> Saved:
    """The adapter tensors of a state dict read from a file (``torch.load`` or safetensors)."""
    shapes, tensors = {}, {}
    for name, value in state_dict.items():
        if not is_adapter(name) or not isinstance(value, torch.Tensor):
            continue
        key = adapter_key(name)
        shapes[key] = _shape(value)
        tensors[key] = (value.to_local() if isinstance(value, DTensor) else value).detach().cpu()
    return Saved(where, shapes, tensors)


def read_file(path: Path) -> Saved:
    """Adapter tensors of one ``.safetensors`` / ``.bin`` / ``.pt`` file."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return saved_from_state_dict(load_file(str(path)), path.name)
    # pickled DTensors (accelerate < 1.15, see its PR #4206) need weights_only=False to be read at all
    return saved_from_state_dict(torch.load(str(path), map_location="cpu", weights_only=False), path.name)


def read_adapter_dir(path: Path) -> Saved:
    """The adapter file of a ``save_pretrained`` directory (safetensors, or ``adapter_model.bin``)."""
    for name in ("adapter_model.safetensors", "adapter_model.bin"):
        if (path / name).exists():
            return read_file(path / name)
    raise CheckFailed(f"no adapter file in {path.name}/: {sorted(p.name for p in path.iterdir())}")


def dcp_load_here(state: Dict[str, Any], path: Path) -> None:
    """``dcp.load(state, checkpoint_id=path)`` on this rank alone, in place. torch 2.4's ``dcp.load`` has no
    ``no_dist`` (observed: TypeError), so there the private loader that has it since torch 2.2 is used."""
    import inspect

    import torch.distributed.checkpoint as dcp

    if "no_dist" in inspect.signature(dcp.load).parameters:
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    else:
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

        _load_state_dict(state, storage_reader=FileSystemReader(str(path)), no_dist=True)


def read_dcp(path: Path, prefix: str = "model.") -> Saved:
    """The adapter entries of a torch.distributed.checkpoint directory: the global size its metadata records, and
    the values, read on this rank alone (``no_dist``) into tensors of that size. ``prefix``: the top-level key
    the state dict was saved under (accelerate and the raw paths use ``{"model": state_dict}``)."""
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    entries = {k: m for k, m in meta.items() if k.startswith(prefix) and is_adapter(k) and hasattr(m, "size")}
    wanted = {k[len(prefix) :]: torch.empty(tuple(m.size), dtype=m.properties.dtype) for k, m in entries.items()}
    if wanted:
        dcp_load_here({prefix.rstrip("."): wanted}, path)
    return Saved(
        f"DCP checkpoint {path.name}/",
        {adapter_key(k): tuple(v.shape) for k, v in wanted.items()},
        {adapter_key(k): v for k, v in wanted.items()},
    )


MODEL_FILES = ("adapter_model", "pytorch_model", "model")
"""Name stems of the model/adapter files in a checkpoint directory (optimizer, scheduler, RNG and argument files
are not model state)."""


def read_checkpoint_dir(path: Path) -> List[Saved]:
    """Every model or adapter file of a checkpoint directory (``save_state``, a Trainer ``checkpoint-N``):
    safetensors and ``.bin`` files and DCP subdirectories named like ``MODEL_FILES``, empty ones included."""
    found = []
    for item in sorted(path.iterdir()):
        if not item.name.startswith(MODEL_FILES):
            continue
        if item.is_dir() and (item / ".metadata").exists():
            found.append(read_dcp(item))
        elif item.suffix in (".safetensors", ".bin"):
            found.append(read_file(item))
    return found


def gathered_adapter(model: nn.Module) -> Dict[str, torch.Tensor]:
    """Every adapter tensor of a (wrapped) model, unsharded, on CPU, by adapter key. Collective under FSDP."""
    if wrapper_kind(model) == "fsdp1":
        with FullyShardedDataParallel.summon_full_params(model, writeback=False):
            return {adapter_key(n): p.detach().cpu().clone() for n, p in model.named_parameters() if is_adapter(n)}
    out = {}
    for name, param in model.named_parameters():
        if is_adapter(name):
            full = param.full_tensor() if isinstance(param, DTensor) else param
            out[adapter_key(name)] = full.detach().cpu().clone()
    return out


def fsdp1_full_state_dict(model: nn.Module) -> ContextManager:
    """FSDP1's ``FULL_STATE_DICT`` state-dict type on an FSDP1 root, as accelerate's FSDP1 save and adapter load set
    it: every rank gathers, nothing offloaded (on CPU the offload path frees storage the state dict still uses).
    Nothing for another model (FSDP2, unwrapped): its state dict needs no such setting."""
    if not isinstance(model, FullyShardedDataParallel):
        return contextlib.nullcontext()
    config = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
    return FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT, config)


def full_shapes(model: nn.Module) -> Dict[str, Tuple[int, ...]]:
    """Adapter key -> shape, read from an unwrapped model (where every shape is the full one)."""
    return {adapter_key(n): tuple(p.shape) for n, p in model.named_parameters() if is_adapter(n)}


def logits(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Eval-mode logits on ``batch``, on CPU. Collective under FSDP: every rank feeds the same batch, so every
    rank gets the whole batch's logits."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model(input_ids=batch).logits.detach().cpu()
    model.train(was_training)
    return out


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def _fmt(shape: Tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    rtol, atol = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol)


def _listed(items: List[str], limit: int = 3) -> str:
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return "; ".join(items[:limit]) + more


def _value_mismatch(key: str, saved: torch.Tensor, trained: torch.Tensor) -> str:
    if saved.dtype != trained.dtype:
        return f"adapter tensor {key} saved as {saved.dtype}, trained in {trained.dtype}"
    return f"adapter tensor {key} differs from the trained one by max |diff| {_max_diff(saved, trained):.3g}"


def check_saved(
    saved: Saved, expected: Mapping[str, Tuple[int, ...]], trained: Optional[Mapping[str, torch.Tensor]] = None
) -> dict:
    """Every adapter tensor is in the checkpoint, with its full shape, and (given ``trained``) equal to the trained
    one. Raises CheckFailed naming each tensor that fails, with both shapes or the difference."""
    trained = trained or {}
    missing = sorted(k for k in expected if k not in saved.shapes)
    wrong_shape = [
        f"adapter tensor {k} saved with shape {_fmt(saved.shapes[k])}, full shape {_fmt(expected[k])}"
        for k in sorted(expected)
        if k in saved.shapes and saved.shapes[k] != tuple(expected[k])
    ]
    differ = [
        _value_mismatch(k, saved.tensors[k], trained[k])
        for k in sorted(expected)
        if k in saved.tensors
        and k in trained
        and saved.shapes[k] == tuple(expected[k])
        and not torch.equal(saved.tensors[k], trained[k])
    ]
    failed = []
    if missing:
        failed.append(
            f"{saved.where} holds {len(expected) - len(missing)}/{len(expected)} adapter tensors "
            f"(missing {_listed(missing, 2)})"
        )
    if wrong_shape:
        failed.append(f"{saved.where}: {len(wrong_shape)}/{len(expected)} wrong shapes: {_listed(wrong_shape)}")
    if differ:
        failed.append(f"{saved.where}: {len(differ)}/{len(expected)} not the trained values: {_listed(differ)}")
    if failed:
        raise CheckFailed("; ".join(failed))
    return {"saved_where": saved.where, "saved_adapter_tensors": len(expected)}


def reload_and_check(
    saved: Saved,
    reload: Callable[[], nn.Module],
    expected: Mapping[str, Tuple[int, ...]],
    trained: Mapping[str, torch.Tensor],
    fsdp_logits: torch.Tensor,
    batch: torch.Tensor,
    dtype: torch.dtype,
    untrained_logits: Optional[torch.Tensor] = None,
) -> dict:
    """The three round-trip checks. ``expected`` is every adapter tensor's full shape (from the unwrapped model),
    ``trained`` the adapter gathered from FSDP after training, ``fsdp_logits`` the FSDP model's logits on ``batch``.

    1. every adapter tensor is in the checkpoint with its full shape (checked before anything is loaded, so a
       loader's own size error cannot hide which tensor is wrong);
    2. it equals the trained adapter, and so does the fresh model ``reload()`` returns with the checkpoint loaded;
    3. that model's logits match ``fsdp_logits`` within ``TOLERANCE[dtype]``.

    ``untrained_logits`` (the same model with its adapter at init) proves check 3 can fail: if they too were within
    the tolerance, the check could not tell a lost adapter from a reloaded one, and that fails as well.
    """
    checks = check_saved(saved, expected, trained)
    reloaded = reload()
    reloaded.eval()
    now = {adapter_key(n): p.detach().cpu() for n, p in reloaded.named_parameters() if is_adapter(n)}
    # PEFT may upcast a half-precision adapter on load (autocast_adapter_dtype): compare values, not storage dtype
    not_loaded = [
        f"{k} (max |diff| {_max_diff(now[k], trained[k]):.3g})"
        for k in sorted(trained)
        if k not in now or not torch.equal(now[k].to(trained[k].dtype), trained[k])
    ]
    got = logits(reloaded, batch).float()
    diff = _max_diff(got, fsdp_logits.float())
    rtol, atol = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    failed = []
    if not_loaded:
        failed.append(
            f"reloaded model does not hold the trained adapter: {len(not_loaded)}/{len(trained)}: {_listed(not_loaded)}"
        )
    if not _close(got, fsdp_logits.float(), dtype):
        failed.append(
            f"reloaded model's logits differ from the FSDP model's: max |diff| {diff:.3g} "
            f"(tolerance rtol {rtol:g}, atol {atol:g}, {dtype})"
        )
    gap = None
    if untrained_logits is not None:
        gap = _max_diff(untrained_logits.float(), fsdp_logits.float())
        if _close(untrained_logits.float(), fsdp_logits.float(), dtype):
            failed.append(f"an untrained adapter's logits are within the tolerance too (gap {gap:.3g})")
    if failed:
        raise CheckFailed("; ".join(failed))
    return {**checks, "logits_max_diff": diff, "logits_gap_untrained": gap, "logits_rtol": rtol, "logits_atol": atol}


def check_resumed(
    resumed: Mapping[str, torch.Tensor],
    uninterrupted: Mapping[str, torch.Tensor],
    start: Mapping[str, torch.Tensor],
    dtype: torch.dtype,
) -> dict:
    """After a resume, every adapter tensor matches the uninterrupted run's at the same step, within
    ``TOLERANCE[dtype]``. ``start`` (the adapter before training) tells a resume that restarted from init apart."""
    bad = []
    for key in sorted(uninterrupted):
        if key not in resumed:
            bad.append(f"{key} missing after the resume")
        elif not _close(resumed[key], uninterrupted[key], dtype):
            hint = " (still its init value)" if key in start and torch.equal(resumed[key], start[key]) else ""
            bad.append(
                f"{key}: max |diff| {_max_diff(resumed[key], uninterrupted[key]):.3g} vs the uninterrupted run{hint}"
            )
    diff = max((_max_diff(resumed[k], uninterrupted[k]) for k in uninterrupted if k in resumed), default=0.0)
    change = max((_max_diff(uninterrupted[k], start[k]) for k in uninterrupted if k in start), default=0.0)
    if bad:
        raise CheckFailed(
            f"resumed run does not continue the saved one: {len(bad)}/{len(uninterrupted)} adapter tensors differ "
            f"after the same steps: {_listed(bad)} (training itself moved them by up to {change:.3g})"
        )
    return {"resume_max_diff": diff, "training_max_change": change}


def optimizer_digest(optimizer: Any) -> List[float]:
    """Sums of |exp_avg|, |exp_avg_sq| and of ``step`` over every rank's optimizer state (Adam): equal before a
    save and after the load exactly when the optimizer state came back. Collective."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps torch's
    total = torch.zeros(3, dtype=torch.float64)
    for state in inner.state.values():
        for i, key in enumerate(("exp_avg", "exp_avg_sq", "step")):
            value = state.get(key)
            if value is None:
                continue
            value = value.to_local() if isinstance(value, DTensor) else value
            total[i] += float(value.detach().double().abs().sum()) if torch.is_tensor(value) else float(value)
    if dist.is_initialized() and dist.get_backend() == "nccl":
        # nccl reduces CUDA tensors only ("No backend type associated with device type cpu", seen on the GPU run of
        # 2026-11-28); the optimizer state may sit on the CPU (offload) whatever the backend
        total = total.to(torch.device("cuda", torch.cuda.current_device()))
    if dist.is_initialized():
        dist.all_reduce(total)
    return [float(x) for x in total.tolist()]


def check_restored(
    restored: Mapping[str, torch.Tensor], at_save: Mapping[str, torch.Tensor], digests: Tuple[List[float], List[float]]
) -> dict:
    """Right after a load: the adapter is the one that was saved (exactly), and so is the optimizer state (its
    digests, ``(saved, loaded)``, agree to 1e-9 relative)."""
    saved, loaded = digests
    differ = [k for k in sorted(at_save) if k not in restored or not torch.equal(restored[k], at_save[k])]
    failed = []
    if differ:
        failed.append(
            f"the load did not restore the model: {len(differ)}/{len(at_save)} adapter tensors differ from "
            f"the saved ones: {_listed(differ, 2)}"
        )
    if not all(abs(a - b) <= 1e-9 * max(abs(a), 1.0) for a, b in zip(saved, loaded)):
        failed.append(
            "the load did not restore the optimizer state: sum |exp_avg|, |exp_avg_sq|, step = "
            f"{', '.join(f'{x:.4g}' for x in loaded)} after loading, {', '.join(f'{x:.4g}' for x in saved)} when saved"
        )
    if failed:
        raise CheckFailed("; ".join(failed))
    return {"optimizer_digest": saved}


@contextlib.contextmanager
def cell_dir(ctx: RankContext, params: Mapping[str, Any]) -> Iterator[Path]:
    """An empty directory for this cell's checkpoints, the same path on every rank, in the folder every node sees
    (``ctx.shared_dir()``: one rank writes what all read back); rank 0 removes it after the block. Collective on
    entry."""
    name = "checkpoint-" + "-".join(f"{k}_{v}" for k, v in sorted(params.items()))
    path = ctx.shared_dir() / name
    if ctx.is_main:
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    barrier()
    try:
        yield path
    finally:
        if ctx.is_main:
            shutil.rmtree(path, ignore_errors=True)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def on_every_rank(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` here; if it raised on any rank, raise on every rank before anyone moves on.

    A step that fails on one rank only (rank 0 writing a file, say) must not let the others walk into their next
    collective, which the failed rank never joins. The failed rank raises its own error; the others raise a
    RuntimeError naming it (the lowest failing rank speaks for the cell, see runner.session.observe).
    """
    failed: Optional[BaseException] = None
    result = None
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - re-raised below, once every rank knows
        failed = exc
    if dist.is_initialized() and dist.get_world_size() > 1:
        summaries: List[Optional[str]] = [None] * dist.get_world_size()
        mine = None if failed is None else f"{type(failed).__name__}: {str(failed)[:300]}"
        dist.all_gather_object(summaries, mine)
        others = [(r, s) for r, s in enumerate(summaries) if s is not None]
        if failed is None and others:
            rank, summary = others[0]
            raise RuntimeError(f"rank {rank} failed in this step, so this rank stops too: {summary}")
    if failed is not None:
        raise failed
    return result
