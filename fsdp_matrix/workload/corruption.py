"""Checks for silent corruption: what FSDP, accelerate, the Trainer or PEFT can get wrong without raising.

- **forward**: before training, the wrapped model's logits on the fixed batch equal the unwrapped model's (a
  ``Reference`` taken before wrapping) within ``LOGITS_TOLERANCE`` of the coarser of the two logits dtypes. A
  mismatch names the first module, in execution order, whose output differs.
- **sharding** (right after wrapping), **ranks agree** and **shards trained** (after training): see shards.py.

``CorruptionChecks`` runs all four around one training run; ``train_and_check``, every entry and ``wrap_and_train``
use it, with a reference taken from the model before wrapping wherever they hold it.

Each failure names the tensor (or unit, or module), the rank and the size of the difference. Every check gathers
what each rank saw, so all ranks reach the same verdict.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn

try:
    from torch.distributed.fsdp import FSDPModule
except ImportError:  # torch < 2.6
    from torch.distributed._composable.fsdp import FSDPModule

from fsdp_matrix.workload.activation import ac_kind
from fsdp_matrix.workload.checks import DTensor, clean_name, trainable_names, wrapper_kind
from fsdp_matrix.workload.dtypes import (
    DtypePromise,
    check_compute,
    check_optimizer,
    check_stored,
    dtype_promise_of,
    has_4bit,
)
from fsdp_matrix.workload.shards import (
    Shape,
    check_pieces_trained,
    check_ranks_agree,
    check_sharding,
    gather,
    holding,
    max_diff,
    snapshot_pieces,
)
from fsdp_matrix.workload.units import StructurePromise, check_structure, checkpointing_asked, tied_groups

LOGITS_TOLERANCE = {
    torch.float32: (1.3e-6, 1e-5),
    torch.bfloat16: (1.6e-2, 1.6e-2),
    torch.float16: (1e-3, 1e-3),
}
"""dtype -> (rtol, atol) for logits and resumed weights (checkpoint.py's docstring says why these values)."""


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
    tied: List[List[str]] = field(default_factory=list)
    """Cleaned names sharing one parameter on the unwrapped model (units.tied_groups): each group must stay managed
    by one FSDP unit."""


ReferenceLike = Union[Reference, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]
"""What ``train_and_check`` takes as its reference: a Reference, the unwrapped logits, or ``batch -> logits``."""


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
    """Logits (on CPU) and each module's first output, computed as training computes them: in train mode, with
    gradients enabled, the RNG forked and seeded (the same dropout masks for the unwrapped and the wrapped model).
    The mode and the RNG are restored after, and FSDP2 modules resharded.

    Why not eval mode or ``no_grad`` (other code paths than the cell's training, observed): in eval mode PEFT's LoRA on
    expert parameters (moe, use_orig_params=False) raised "a view ... modified inplace" where training raises its
    "setStorage" error; under ``no_grad`` FSDP1 reshards a SHARD_GRAD_OP unit right after its forward, and DoRA then
    read a 1-D shard of ``lora_A`` (IndexError). Why reshard: FSDP2 leaves the root's parameters unsharded after a
    forward (it expects the backward); ``model.parameters()`` then lists plain unsharded copies, and an optimizer
    built from them never moves the real, sharded ones (observed: ``modules_to_save``'s head copy, a root
    parameter, stayed unchanged through training; pytorch#149205).
    """
    was_training = model.training
    devices = [batch.device.index or 0] if batch.device.type == "cuda" else []
    model.train()
    try:
        with torch.random.fork_rng(devices=devices), torch.enable_grad(), _module_outputs(model) as outputs:
            torch.manual_seed(0)
            out = model(input_ids=batch)
    finally:
        model.train(was_training)
        reshard(model)
    return _first_tensor(out).detach().to("cpu", copy=True), outputs


def reshard(model: nn.Module) -> None:
    """Every FSDP2 module back to its sharded parameters (a no-op where they already are)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def take_reference(model: nn.Module, batch: torch.Tensor) -> Optional[Reference]:
    """The unwrapped model's parameters (shape, dtype) and its forward on ``batch``. Not collective.

    An unwrapped forward that raises leaves the forward check without a reference (recorded, never raised here):
    the cell's own training then shows the error where it belongs.
    """
    params = {clean_name(n): (tuple(p.shape), p.dtype) for n, p in model.named_parameters()}
    tied = tied_groups(model)
    try:
        logits, outputs = forward_logits(model, batch)
    except Exception as exc:  # noqa: BLE001 - the error is the model's, judged by training; this check records it
        return Reference(params, error=f"{type(exc).__name__}: {str(exc)[:200]}", tied=tied)
    return Reference(params, logits, outputs, tied=tied)


def as_reference(reference: Optional[ReferenceLike], batch: torch.Tensor) -> Optional[Reference]:
    """A Reference from what ``train_and_check`` was given (logits or a callable have no parameter inventory)."""
    if reference is None or isinstance(reference, Reference):
        return reference
    logits = reference if isinstance(reference, torch.Tensor) else reference(batch)
    return Reference(logits=_first_tensor(logits).detach().to("cpu", copy=True))


def tolerance(*dtypes: torch.dtype) -> Tuple[float, float]:
    """(rtol, atol) of the coarsest of ``dtypes`` (fp32's for a dtype not in LOGITS_TOLERANCE)."""
    pairs = [LOGITS_TOLERANCE.get(d, LOGITS_TOLERANCE[torch.float32]) for d in dtypes]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


def _logits_close(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> bool:
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol)


def check_forward(
    model: nn.Module,
    reference: Optional[Reference],
    batch: torch.Tensor,
    seen: Optional[Dict[str, torch.Tensor]] = None,
) -> Tuple[Dict[str, Any], List[str]]:
    """The forward check on the wrapped model: (checks, failures). Collective when it runs. ``seen`` receives each
    module's first output of the wrapped model's forward (for the compute-dtype check)."""
    if reference is None:
        return {"forward_check": "no reference"}, []
    if reference.logits is None:
        return {"forward_check": f"not run: the unwrapped forward raised {reference.error}"}, []
    logits, outputs = forward_logits(model, batch)
    if seen is not None:
        seen.update(outputs)
    # under FSDP mixed precision the wrapped model computes in its param_dtype even where the model casts its
    # logits back to fp32 (LlamaForCausalLM on transformers 4.44 does): judge it by the dtype it computed in
    computed = [d for d in (mixed_param_dtype(model),) if d is not None]
    tol = rtol, atol = tolerance(reference.logits.dtype, logits.dtype, *computed)
    diff = max_diff(logits, reference.logits)
    where = ""
    if not _logits_close(logits, reference.logits, rtol, atol):
        differ = (k for k, v in reference.outputs.items() if k in outputs and not _logits_close(outputs[k], v, *tol))
        first = next(differ, None)
        if first is not None:
            gap = max_diff(outputs[first], reference.outputs[first])
            where = f"; first differing module {first} (max |diff| {gap:.3g})"
        elif logits.shape != reference.logits.shape:
            where = f"; shapes {list(logits.shape)} vs {list(reference.logits.shape)}"
    seen = gather((diff, where, _logits_close(logits, reference.logits, rtol, atol)))
    failures = [
        f"forward: rank {r}'s logits differ from the unwrapped model's by max |diff| {d:.3g} "
        f"(rtol {rtol:g}, atol {atol:g}){w}"
        for r, (d, w, ok) in enumerate(seen)
        if not ok
    ]
    worst = max(d for d, _, _ in seen)
    return {"forward_max_diff": worst if math.isfinite(worst) else str(worst), "forward_tol": [rtol, atol]}, failures


def mixed_param_dtype(model: nn.Module) -> Optional[torch.dtype]:
    """The compute dtype of the FSDP mixed precision in force on ``model`` (FSDP1 ``MixedPrecision.param_dtype``,
    FSDP2 ``MixedPrecisionPolicy.param_dtype``), or None."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    for module in model.modules():
        if isinstance(module, FullyShardedDataParallel):
            return getattr(getattr(module, "mixed_precision", None), "param_dtype", None)
        if isinstance(module, FSDPModule):
            group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
            policy = getattr(group, "mp_policy", None)
            if policy is None and getattr(group, "fsdp_params", None):
                # torch 2.15 resolves the policy per parameter (FSDPParam.mp_policy) and the group keeps none: read
                # as the group's, no fp32 master was promised on torch2.15 (observed 2026-11-28, mp-upcast cells)
                policy = getattr(group.fsdp_params[0], "mp_policy", None)
            return getattr(policy, "param_dtype", None)
    return None


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
        params: Optional[Mapping[str, Any]] = None,
        entry: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.trainable = None if trainable is None else sorted({clean_name(n) for n in trainable})
        """Cleaned names given as trainable; None: read from the wrapped model."""
        self.world_size = world_size
        self.reference = reference
        self.batch = batch
        entry = entry or {}
        self.checkpointing = checkpointing_asked(params, entry.get("checkpointing"))
        """Whether the cell asks for activation checkpointing: its ``ac``/``gc`` axes (``params``) or its entry's
        setting (``entry["checkpointing"]``); None: not known (units.checkpointing_asked)."""
        self.checkpoint_kind = ac_kind(params)
        """The ``ac`` axis's promise (``fsdp``, ``hf``, ``none``); None for a cell without it (ac_kind)."""
        self.accelerate_mp = entry.get("mixed_precision")
        """``Accelerator.mixed_precision`` of an accelerate/Trainer entry (None for the torch entry): dtypes.py."""
        self.dtypes: Optional[DtypePromise] = None
        self.checks: Dict[str, Any] = {}
        self.failures: List[str] = []
        self.before: Dict[str, torch.Tensor] = {}
        self.ran = False

    def after_wrap(self, model: nn.Module) -> None:
        """Sharding (before any forward, which could leave units unsharded), forward, and each rank's piece of every
        trainable tensor. Collective."""
        kind = wrapper_kind(model)
        # a forward before this one (the caller's) can leave FSDP2's root unsharded; judge the sharded state
        reshard(model)
        names = self.trainable if self.trainable is not None else trainable_names(model)
        master = names if mixed_param_dtype(model) in (torch.bfloat16, torch.float16) else ()
        unwrapped = self.reference and self.reference.params
        checks, failures, held = check_sharding(model, kind, self.world_size, unwrapped, master)
        self.checks.update(checks)
        self.failures += failures
        self._structure_and_dtypes(model, held, names)
        outputs: Dict[str, torch.Tensor] = {}
        if self.batch is not None:
            checks, failures = check_forward(model, self.reference, self.batch, outputs)
            self.checks.update(checks)
            self.failures += failures
        self.checks["dtypes"].update(check_compute(self.dtypes, model, outputs))
        # the forward may have lazily initialized FSDP1 (its shard moved to _local_shard): read the pieces again
        self.before = snapshot_pieces(holding(model, kind, self.world_size), names)
        self.ran = True

    def _structure_and_dtypes(self, model: nn.Module, held: Any, trainable: List[str]) -> None:
        """The structural check (units.py) and the stored-dtype promise (dtypes.py), right after wrapping."""
        device = None if self.batch is None else self.batch.device
        tied = self.reference.tied if self.reference is not None else []
        promise = StructurePromise(self.checkpointing, tied, device, self.checkpoint_kind)
        checks, failures = check_structure(model, promise)
        self.checks.update(checks)
        self.failures += failures
        load = self.reference.params if self.reference is not None else None
        four_bit = wrapper_kind(model) == "fsdp2" and has_4bit(model)
        self.dtypes = dtype_promise_of(load, self.accelerate_mp, mixed_param_dtype(model), four_bit)
        self.checks["dtypes"] = check_stored(self.dtypes, held, trainable)

    def after_training(self, model: nn.Module, optimizer: Any = None) -> Tuple[Dict[str, Any], List[str]]:
        """Shards trained and ranks agree, plus what ``after_wrap`` found, and the optimizer state's dtypes
        (dtypes.py's check_optimizer) of the ``optimizer`` that trained: (checks, failures). Collective."""
        if not self.ran:
            return {}, []
        if optimizer is not None:
            states, wrong = check_optimizer(optimizer)
            self.checks["dtypes"].update(states)
            self.failures += wrong
        held = holding(model, wrapper_kind(model), self.world_size)
        trained, untrained = check_pieces_trained(self.before, snapshot_pieces(held, sorted(self.before)))
        agree, disagree = check_ranks_agree(held.unmanaged)
        promised = self.dtypes.failures if self.dtypes is not None else []
        return {**self.checks, **trained, **agree}, self.failures + promised + untrained + disagree
