"""Checks for silent corruption: what FSDP, accelerate, the Trainer or PEFT can get wrong without raising.

- **forward**: before training, the wrapped model's logits on the fixed batch equal the unwrapped model's (a
  ``Reference`` taken before wrapping) within ``TOLERANCE`` of the coarser of the two logits dtypes. A mismatch
  names the first module, in execution order, whose output differs.
- **sharding**: right after wrapping, each rank holds what sharding promises, per dtype: the sum over managed
  parameters of their shard (ceil(numel / g) elements, FSDP2: ceil(dim 0 / g) rows) plus every unmanaged parameter
  in full, counted from the unwrapped model, with a little slack per tensor for FSDP's padding. g is the shard group
  (``shard_group``). A unit that holds more than its share, and a tensor in a wider dtype than before wrapping, are
  named.
- **ranks agree**: after training, every parameter FSDP does not manage (a plain tensor on each rank) is
  bit-identical on every rank. Gathered FSDP parameters agree by construction; what diverges is what FSDP never saw.
- **shards trained**: every trainable tensor's piece on each rank changed in training (a rank whose piece is empty,
  FSDP's padding, is skipped for that tensor).

Each failure names the tensor (or unit, or module), the rank and the size of the difference. Every check gathers
what each rank saw, so all ranks reach the same verdict.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

import torch
from torch import distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

try:
    from torch.distributed.fsdp import FSDPModule
except ImportError:  # torch < 2.6
    from torch.distributed._composable.fsdp import FSDPModule

from fsdp_matrix.workload.checks import _FLAT, DTensor, _as_bytes, _is_flat, clean_name, trainable_names, wrapper_kind

TOLERANCE = {
    torch.float32: (1.3e-6, 1e-5),
    torch.bfloat16: (1.6e-2, 1.6e-2),
    torch.float16: (1e-3, 1e-3),
}
"""dtype -> (rtol, atol) for logits and resumed weights (checkpoint.py's docstring says why these values)."""

_SLACK_BYTES = 16
"""Padding allowed per managed tensor on top of its shard (FSDP1 aligns each original parameter in the flat one)."""

Shape = Tuple[int, ...]


@dataclass
class Reference:
    """What the unwrapped model computes and holds, taken before wrapping (``take_reference``)."""

    params: Optional[Dict[str, Tuple[Shape, torch.dtype]]] = None
    """Cleaned parameter name -> (shape, dtype) on the unwrapped model; None: unknown (read from the wrapped one)."""
    logits: Optional[torch.Tensor] = None
    """Logits on the fixed batch in eval mode, on CPU; None when the unwrapped forward raised (``error``)."""
    outputs: Dict[str, torch.Tensor] = field(default_factory=dict)
    """Each module's first output tensor in that forward, on CPU, in execution order (names where a forward differs)."""
    error: Optional[str] = None
    """Why there are no logits: the unwrapped forward's exception, as ``Type: message``."""


ReferenceLike = Union[Reference, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]
"""What ``train_and_check`` takes as its reference: a Reference, the unwrapped logits, or ``batch -> logits``."""


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``: the JSON-friendly spelling used in the checks dict."""
    return str(dtype).replace("torch.", "")


def gather(obj: Any) -> List[Any]:
    """``obj`` from every rank, indexed by rank (``[obj]`` without a process group). Collective."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _module_key(name: str) -> str:
    # an FSDP1 wrapper and the module it wraps get the same key; the first output recorded under it wins
    return clean_name(name + ".").rstrip(".") if name else "<root>"


def _first_tensor(out: Any) -> Optional[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    values = out.values() if isinstance(out, Mapping) else out if isinstance(out, (tuple, list)) else ()
    return next((v for v in values if isinstance(v, torch.Tensor)), None)


@contextlib.contextmanager
def _module_outputs(model: nn.Module) -> Iterator[Dict[str, torch.Tensor]]:
    seen: Dict[str, torch.Tensor] = {}

    def hook(key: str) -> Callable:
        def record(module: nn.Module, args: Any, out: Any) -> None:
            tensor = _first_tensor(out)
            if key not in seen and isinstance(tensor, torch.Tensor) and not isinstance(tensor, DTensor):
                seen[key] = tensor.detach().to("cpu", copy=True)

        return record

    handles = [m.register_forward_hook(hook(_module_key(n))) for n, m in model.named_modules()]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def forward_logits(model: nn.Module, batch: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Logits (on CPU) and each module's first output, in eval mode (no dropout) and with gradients enabled, as
    training computes them; the mode is restored, and FSDP2 modules are resharded.

    Why with gradients: under ``no_grad`` FSDP1 reshards a SHARD_GRAD_OP unit right after its forward, where
    training keeps it for the backward, and DoRA then reads a 1-D shard of ``lora_A`` (IndexError, observed on
    dora-fp32-orig1-peft_policy-llama-shard_grad_op-ws2): another code path than the cell's. Why reshard: FSDP2
    leaves the root's parameters unsharded after a forward (it expects the backward); ``model.parameters()`` then
    lists plain unsharded copies, and an optimizer built from them never moves the real, sharded ones (observed:
    ``modules_to_save``'s head copy, a root parameter, stayed unchanged through training).
    """
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad(), _module_outputs(model) as outputs:
            out = model(input_ids=batch)
    finally:
        model.train(was_training)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
    return _first_tensor(out).detach().to("cpu", copy=True), outputs


def take_reference(model: nn.Module, batch: torch.Tensor) -> Reference:
    """The unwrapped model's parameters (shape, dtype) and its forward on ``batch``. Not collective.

    An unwrapped forward that raises leaves the forward check without a reference (recorded, never raised here):
    the cell's own training then shows the error where it belongs.
    """
    params = {clean_name(n): (tuple(p.shape), p.dtype) for n, p in model.named_parameters()}
    try:
        logits, outputs = forward_logits(model, batch)
    except Exception as exc:  # noqa: BLE001 - the error is the model's, judged by training; this check records it
        return Reference(params, error=f"{type(exc).__name__}: {str(exc)[:200]}")
    return Reference(params, logits, outputs)


def as_reference(reference: Optional[ReferenceLike], batch: torch.Tensor) -> Optional[Reference]:
    """A Reference from what ``train_and_check`` was given (logits or a callable have no parameter inventory)."""
    if reference is None or isinstance(reference, Reference):
        return reference
    logits = reference if isinstance(reference, torch.Tensor) else reference(batch)
    return Reference(logits=_first_tensor(logits).detach().to("cpu", copy=True))


def tolerance(*dtypes: torch.dtype) -> Tuple[float, float]:
    """(rtol, atol) of the coarsest of ``dtypes`` (fp32's for a dtype not in TOLERANCE)."""
    pairs = [TOLERANCE.get(d, TOLERANCE[torch.float32]) for d in dtypes]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return math.inf
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> bool:
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol)


def check_forward(
    model: nn.Module, reference: Optional[Reference], batch: torch.Tensor
) -> Tuple[Dict[str, Any], List[str]]:
    """The forward check on the wrapped model: (checks, failures). Collective when it runs."""
    if reference is None:
        return {"forward_check": "no reference"}, []
    if reference.logits is None:
        return {"forward_check": f"not run: the unwrapped forward raised {reference.error}"}, []
    logits, outputs = forward_logits(model, batch)
    rtol, atol = tolerance(reference.logits.dtype, logits.dtype)
    diff = _diff(logits, reference.logits)
    where = ""
    if not _close(logits, reference.logits, rtol, atol):
        first = next(
            (k for k, v in reference.outputs.items() if k in outputs and not _close(outputs[k], v, rtol, atol)), None
        )
        if first is not None:
            gap = _diff(outputs[first], reference.outputs[first])
            where = f"; first differing module {first} (max |diff| {gap:.3g})"
        elif logits.shape != reference.logits.shape:
            where = f"; shapes {list(logits.shape)} vs {list(reference.logits.shape)}"
    seen = gather((diff, where, _close(logits, reference.logits, rtol, atol)))
    failures = [
        f"forward: rank {r}'s logits differ from the unwrapped model's by max |diff| {d:.3g} "
        f"(rtol {rtol:g}, atol {atol:g}){w}"
        for r, (d, w, ok) in enumerate(seen)
        if not ok
    ]
    worst = max(d for d, _, _ in seen)
    return {"forward_max_diff": worst if math.isfinite(worst) else str(worst), "forward_tol": [rtol, atol]}, failures


@dataclass
class Holding:
    """What this rank holds of the wrapped model's parameters."""

    managed: Dict[str, Tuple[Shape, torch.dtype]]
    """Cleaned name -> (full shape, dtype) of every parameter FSDP shards or manages."""
    unmanaged: Dict[str, torch.Tensor]
    """Cleaned name -> the plain tensor of every parameter FSDP does not manage."""
    units: List[Tuple[str, int, int, torch.dtype]]
    """(unit, elements held here, elements in full, dtype): an FSDP1 FlatParameter or an FSDP2 parameter."""
    pieces: Dict[str, torch.Tensor]
    """Cleaned name -> this rank's piece of the parameter (an empty tensor where the rank holds none of it)."""
    group: int
    """The shard group g: how many ranks share one copy of a managed parameter."""


def _fsdp1_modules(model: nn.Module) -> List[Tuple[str, FullyShardedDataParallel]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, FullyShardedDataParallel)]


def _fsdp1_group(model: nn.Module, world_size: int) -> int:
    modules = _fsdp1_modules(model)
    strategy = modules[0][1].sharding_strategy if modules else ShardingStrategy.FULL_SHARD
    if strategy == ShardingStrategy.NO_SHARD:
        return 1
    if strategy.name.startswith(("HYBRID_SHARD", "_HYBRID_SHARD")):
        return modules[0][1].process_group.size()  # the intra-node shard group
    return world_size


def holding(model: nn.Module, kind: str, world_size: int) -> Holding:
    """This rank's parameters of a wrapped model, split into managed and unmanaged. Not collective."""
    managed: Dict[str, Tuple[Shape, torch.dtype]] = {}
    units: List[Tuple[str, int, int, torch.dtype]] = []
    pieces: Dict[str, torch.Tensor] = {}
    group = world_size
    if kind == "fsdp1":
        group = _fsdp1_group(model, world_size)
        for name, module in _fsdp1_modules(model):
            flat = getattr(module, _FLAT, None)
            if flat is None:
                continue
            prefix = clean_name(name + ".") if name else ""
            local = getattr(flat, "_local_shard", None)
            local = (flat.data if local is None else local).reshape(-1)
            # FSDP1's own alignment padding between original parameters is part of the full flat size
            full = sum(getattr(flat, "_numels_with_padding", flat._numels))
            units.append((prefix.rstrip(".") or "<root>", local.numel(), full, flat.dtype))
            for fqn, shape, info in zip(flat._fqns, flat._shapes, flat._shard_param_infos):
                managed[prefix + fqn] = (tuple(shape), flat.dtype)
                end = (info.offset_in_shard or 0) + (info.numel_in_shard or 0)
                pieces[prefix + fqn] = local[info.offset_in_shard : end] if info.in_shard else local[:0]
    elif kind == "fsdp2":
        replicas = [_replicas(p) for p in model.parameters() if isinstance(p, DTensor)]
        group = world_size // min(replicas, default=1)
    unmanaged: Dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        key = clean_name(name)
        if isinstance(param, DTensor):
            local = param.to_local()
            managed[key] = (tuple(param.shape), param.dtype)
            units.append((key, local.numel(), param.numel(), param.dtype))
            pieces[key] = local
        elif not _is_flat(name, param) and key not in managed:
            unmanaged[key] = pieces[key] = param
    return Holding(managed, unmanaged, units, pieces, group)


def _replicas(param: Any) -> int:
    # HSDP: Replicate on the outer mesh dim, Shard on the inner one; plain FSDP2 has one Shard placement
    mesh = param.device_mesh
    return math.prod(mesh.size(i) for i, p in enumerate(param.placements) if p.is_replicate())


def _share(shape: Shape, group: int, kind: str) -> int:
    numel = math.prod(shape)
    if kind == "fsdp2" and shape:  # FSDP2 shards dim 0: a rank holds whole rows
        return math.ceil(shape[0] / group) * (numel // shape[0] if shape[0] else 0)
    return math.ceil(numel / group)


def check_sharding(
    model: nn.Module, kind: str, world_size: int, reference: Optional[Reference]
) -> Tuple[Dict[str, Any], List[str], Holding]:
    """The sharding check right after wrapping: (checks, failures, this rank's holding). Collective."""
    held = holding(model, kind, world_size)
    g = held.group
    inventory = dict((reference.params if reference else None) or {})
    for key, (shape, dtype) in held.managed.items():
        inventory.setdefault(key, (shape, dtype))
    for key, tensor in held.unmanaged.items():
        inventory.setdefault(key, (tuple(tensor.shape), tensor.dtype))
    promised: Dict[str, int] = {}
    slack: Dict[str, int] = {}
    for key, (shape, dtype) in inventory.items():
        size = torch.empty((), dtype=dtype).element_size()
        name = dtype_name(dtype)
        share = _share(shape, g, kind) if key in held.managed else math.prod(shape)
        promised[name] = promised.get(name, 0) + share * size
        if key in held.managed:
            slack[name] = slack.get(name, 0) + _SLACK_BYTES + g * size
    mine: Dict[str, int] = {}
    for _, local, _, dtype in held.units:
        mine[dtype_name(dtype)] = mine.get(dtype_name(dtype), 0) + local * dtype.itemsize
    for tensor in held.unmanaged.values():
        mine[dtype_name(tensor.dtype)] = mine.get(dtype_name(tensor.dtype), 0) + tensor.numel() * tensor.itemsize
    over = [
        f"unit {unit} holds {local}/{full} {dtype_name(dtype)} elements, its share over {g} ranks {math.ceil(full / g)}"
        for unit, local, full, dtype in held.units
        if local > math.ceil(full / g)
    ]
    wrapped_dtypes = {k: v[1] for k, v in held.managed.items()}
    wrapped_dtypes.update({k: t.dtype for k, t in held.unmanaged.items()})
    wider = [
        f"{key} is {dtype_name(dtype)}, {dtype_name(inventory[key][1])} before wrapping"
        for key, dtype in sorted(wrapped_dtypes.items())
        if key in inventory and dtype.itemsize > inventory[key][1].itemsize
    ]
    seen = gather((mine, over, wider))
    failures = []
    for rank, (bytes_held, units_over, widened) in enumerate(seen):
        too_much = [
            f"{bytes_held[d] - promised.get(d, 0)} {d} bytes over the {promised.get(d, 0)} promised"
            for d in sorted(bytes_held)
            if bytes_held[d] > promised.get(d, 0) + slack.get(d, 0)
        ]
        if too_much or units_over or widened:
            detail = units_over[:2] + ([f"{len(widened)} tensors upcast, e.g. {widened[0]}"] if widened else [])
            failures.append(
                f"sharding: rank {rank} holds {'; '.join(too_much) or 'no more bytes than promised'} "
                f"(shard group {g}): {'; '.join(detail) or 'no single unit over its share'}"
            )
    per_rank = {d: [s[0].get(d, 0) for s in seen] for d in sorted({d for s in seen for d in s[0]})}
    checks = {"shard_group": g, "bytes_per_rank": per_rank, "bytes_promised": dict(sorted(promised.items()))}
    return checks, failures, held


def snapshot_pieces(held: Holding, names: List[str]) -> Dict[str, torch.Tensor]:
    """This rank's piece of each named parameter, as raw bytes on CPU (for ``check_pieces_trained``)."""
    return {n: _as_bytes(held.pieces[n]) for n in names if n in held.pieces}


def check_pieces_trained(
    before: Dict[str, torch.Tensor], after: Dict[str, torch.Tensor]
) -> Tuple[Dict[str, Any], List[str]]:
    """Nothing left untrained: each rank's non-empty piece of every trainable tensor changed. Collective."""
    names = sorted(before)
    empty = [n for n in names if before[n].numel() == 0]
    same = [n for n in names if n in after and before[n].numel() and torch.equal(before[n], after[n])]
    seen = gather((len(names) - len(empty) - len(same), len(empty), [(n, before[n].numel()) for n in same]))
    failures = [
        f"untrained: rank {rank}'s piece of {len(unchanged)} trainable tensors did not change in training "
        f"(max |change| 0), e.g. {unchanged[0][0]} ({unchanged[0][1]} bytes)"
        for rank, (_, _, unchanged) in enumerate(seen)
        if unchanged
    ]
    return {"shards_changed": [s[0] for s in seen], "shards_empty": [s[1] for s in seen]}, failures


def check_ranks_agree(unmanaged: Mapping[str, torch.Tensor]) -> Tuple[Dict[str, Any], List[str]]:
    """Every parameter FSDP does not manage is bit-identical on every rank. Collective."""
    mine = {n: t.detach().to("cpu", copy=True) for n, t in sorted(unmanaged.items())}
    everyone = gather(mine)
    failures, worst = [], 0.0
    for rank, theirs in enumerate(everyone[1:], start=1):
        for name in sorted(set(everyone[0]) | set(theirs)):
            if name not in theirs or name not in everyone[0]:
                failures.append(f"ranks disagree: {name} is on rank {0 if name in everyone[0] else rank} only")
            elif not torch.equal(_as_bytes(theirs[name]), _as_bytes(everyone[0][name])):
                diff = _diff(theirs[name], everyone[0][name])
                worst = max(worst, diff)
                failures.append(f"ranks disagree: rank {rank}'s {name} differs from rank 0's by max |diff| {diff:.3g}")
    checks = {"unmanaged_tensors": len(mine), "unmanaged_max_diff": worst if math.isfinite(worst) else str(worst)}
    return checks, failures


class CorruptionChecks:
    """The four checks around one training run: ``after_wrap`` before training, ``after_training`` after it.

    Failures found after wrapping are held until ``after_training``, so that an error the training itself raises
    stays the cell's error; ``TrainingChecks.finish`` raises them with its own.
    """

    def __init__(
        self,
        trainable: Optional[Iterable[str]],
        world_size: int,
        reference: Optional[Reference] = None,
        batch: Optional[torch.Tensor] = None,
    ) -> None:
        self.trainable = None if trainable is None else sorted({clean_name(n) for n in trainable})
        """Cleaned names given as trainable; None: read from the wrapped model."""
        self.world_size = world_size
        self.reference = reference
        self.batch = batch
        self.checks: Dict[str, Any] = {}
        self.failures: List[str] = []
        self.before: Dict[str, torch.Tensor] = {}
        self.ran = False

    def after_wrap(self, model: nn.Module) -> None:
        """Sharding (before any forward: FSDP1 then still holds only its shards), forward, and each rank's piece of
        every trainable tensor. Collective."""
        kind = wrapper_kind(model)
        checks, failures, held = check_sharding(model, kind, self.world_size, self.reference)
        self.checks.update(checks)
        self.failures += failures
        if self.batch is not None:
            checks, failures = check_forward(model, self.reference, self.batch)
            self.checks.update(checks)
            self.failures += failures
        names = self.trainable if self.trainable is not None else trainable_names(model)
        # the forward may have lazily initialized FSDP1 (its shard moved to _local_shard): read the pieces again
        self.before = snapshot_pieces(holding(model, kind, self.world_size), names)
        self.ran = True

    def after_training(self, model: nn.Module) -> Tuple[Dict[str, Any], List[str]]:
        """Shards trained and ranks agree, plus what ``after_wrap`` found: (checks, failures). Collective."""
        if not self.ran:
            return {}, []
        held = holding(model, wrapper_kind(model), self.world_size)
        trained, untrained = check_pieces_trained(self.before, snapshot_pieces(held, sorted(self.before)))
        agree, disagree = check_ranks_agree(held.unmanaged)
        return {**self.checks, **trained, **agree}, self.failures + untrained + disagree
