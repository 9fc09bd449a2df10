"""The dtype promise check: parameters, gradients, optimizer state and compute in the dtypes the mixed-precision
setting promises (issue 39, point 3).

The setting is read as the entry reads it:

- accelerate (and the Trainer and TRL, which prepare through it): ``Accelerator.mixed_precision`` (the Trainer's
  ``bf16``/``fp16`` arguments become it). With ``bf16``/``fp16`` accelerate upcasts the low-precision trainable
  parameters to fp32 master weights when it wraps: FSDP1 every FlatParameter that requires grad
  (``Accelerator.prepare_model``, since v0.30.0, PR #2674), FSDP2 every trainable parameter
  (``fsdp2_prepare_model``), and says so in a warning or a log line. Those must then be fp32, and it computes in
  that dtype (its autocast and the plugin's mixed-precision policy);
- the ``torch`` entry: FSDP1 ``MixedPrecision.param_dtype`` or FSDP2 ``MixedPrecisionPolicy.param_dtype`` on the
  wrapped model, a compute dtype only: the stored parameters keep the dtype they were loaded in.

The promises, judged where the dtype before wrapping is known (a reference was taken):

- every trainable parameter is stored in its load dtype, or in fp32 where the entry upcasts a low-precision one;
- every frozen parameter is stored in its load dtype;
- every gradient is in its parameter's dtype, read before the optimizer steps (checks.grad_dtypes);
- every floating optimizer state tensor (AdamW's moments) is in its parameter's dtype, after training;
- under a compute dtype, each ``nn.Linear`` outside an adapter's ``ModuleDict`` (the base model's projections) outputs
  that dtype in the forward check's forward, which runs as training does.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn
from torch.torch_version import TorchVersion

from fsdp_matrix.workload.checks import clean_name
from fsdp_matrix.workload.shards import Holding, dtype_name

LOW = (torch.bfloat16, torch.float16)
"""The dtypes a master-weight upcast turns into fp32."""
ACCELERATE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""accelerate's ``mixed_precision`` values and the compute dtype each promises."""


@dataclass
class DtypePromise:
    """What the cell's mixed-precision setting promises, as its entry reads it."""

    load: Optional[Dict[str, torch.dtype]] = None
    """Cleaned parameter name -> its dtype before wrapping; None: not known (the stored dtypes are not judged)."""
    master: bool = False
    """The entry upcasts low-precision trainable parameters to fp32 master weights."""
    compute: Optional[torch.dtype] = None
    """The dtype the forward computes in (autocast / FSDP mixed precision); None: none promised."""
    setting: str = "none"
    """The setting read, for the record: ``accelerate:bf16``, ``fsdp:bfloat16``, ``none``."""
    failures: List[str] = field(default_factory=list)
    """Broken promises found so far (``check_stored``, ``check_compute``), raised with the cell's other checks."""


def accelerate_upcasts() -> bool:
    """The installed accelerate upcasts low-precision trainable parameters under mixed precision: PR #2674, first in
    0.30.0 (https://github.com/huggingface/accelerate/pull/2674). 0.29.3 trains them in their load dtype (observed
    2026-11-28 on peft0.10-tf4.40, TRL's SFT with bf16: the LoRA tensors stay bf16)."""
    try:
        # torch's vendored version comparison: an exported repro installs torch, not packaging
        return TorchVersion(importlib.metadata.version("accelerate")) >= "0.30.0"
    except importlib.metadata.PackageNotFoundError:
        return False


def dtype_promise_of(
    load: Optional[Mapping[str, Tuple[Any, torch.dtype]]],
    accelerate_mp: Optional[str],
    fsdp_dtype: Optional[torch.dtype],
    fsdp2_4bit: bool = False,
    upcasts: Optional[bool] = None,
) -> DtypePromise:
    """The promise of an entry: ``accelerate_mp`` is ``Accelerator.mixed_precision`` (None: not an accelerate entry),
    ``fsdp_dtype`` the FSDP mixed precision's ``param_dtype`` on the wrapped model (corruption.mixed_param_dtype).
    ``fsdp2_4bit``: an FSDP2 model with bitsandbytes 4-bit layers, which accelerate does not upcast (1.15.0's
    ``fsdp2_prepare_model`` skips the upcast where the model has ``Params4bit``, and says nothing). ``upcasts``:
    this accelerate has the upcast at all (None: read from the installed release, ``accelerate_upcasts``)."""
    dtypes = None if load is None else {k: v[1] for k, v in load.items()}
    if accelerate_mp in ACCELERATE_DTYPES:
        upcasts = accelerate_upcasts() if upcasts is None else upcasts
        why = " (4-bit FSDP2: no upcast)" if fsdp2_4bit else "" if upcasts else " (accelerate < 0.30: no upcast)"
        master = upcasts and not fsdp2_4bit
        return DtypePromise(dtypes, master, ACCELERATE_DTYPES[accelerate_mp], f"accelerate:{accelerate_mp}{why}")
    if fsdp_dtype is not None:
        return DtypePromise(dtypes, False, fsdp_dtype, f"fsdp:{dtype_name(fsdp_dtype)}")
    return DtypePromise(dtypes)


def has_4bit(model: nn.Module) -> bool:
    """The model holds bitsandbytes 4-bit layers (``Linear4bit``; their weights are ``Params4bit`` until wrapped)."""
    return any(type(m).__name__ == "Linear4bit" for m in model.modules())


def expected(promise: DtypePromise, name: str, trainable: bool) -> Optional[torch.dtype]:
    """The dtype ``name`` must be stored in; None where its load dtype is not known."""
    load = (promise.load or {}).get(name)
    if load is None:
        return None
    return torch.float32 if trainable and promise.master and load in LOW else load


def stored_dtypes(held: Holding) -> Dict[str, torch.dtype]:
    """Cleaned name -> the dtype each parameter is stored in on the wrapped model (FSDP1's FlatParameter's)."""
    out = {k: v[1] for k, v in held.managed.items()}
    out.update({k: t.dtype for k, t in held.unmanaged.items()})
    return out


def check_stored(promise: DtypePromise, held: Holding, trainable: List[str]) -> Dict[str, Any]:
    """Trainable and frozen parameters in the promised dtypes; failures go to ``promise.failures``. Not
    collective (every rank stores the same dtypes)."""
    stored = stored_dtypes(held)
    train = set(trainable)
    wrong: Dict[bool, List[str]] = {True: [], False: []}
    for name, dtype in sorted(stored.items()):
        want = expected(promise, name, name in train)
        if want is not None and dtype != want:
            wrong[name in train].append(f"{name} is {dtype_name(dtype)}, promised {dtype_name(want)}")
    for is_train, lines in wrong.items():
        if lines:
            kind = "trainable" if is_train else "frozen"
            why = " (fp32 masters: the entry upcasts)" if is_train and promise.master else " (the load dtype)"
            line = f"dtypes: {len(lines)} {kind} parameters not in their promised dtype{why}: {lines[0]}"
            promise.failures.append(line)
    counts: Dict[str, int] = {}
    for name in train:
        if name in stored:
            counts[dtype_name(stored[name])] = counts.get(dtype_name(stored[name]), 0) + 1
    return {"setting": promise.setting, "trainable": dict(sorted(counts.items())), "judged": promise.load is not None}


def _base_linears(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """``nn.Linear`` modules outside a ``ModuleDict`` (PEFT keeps each adapter's layers, and modules_to_save's
    copies, in one): the base model's own projections."""
    inside = {id(m) for d in model.modules() if isinstance(d, nn.ModuleDict) for m in d.modules()}
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and id(m) not in inside]


def check_compute(promise: DtypePromise, model: nn.Module, outputs: Mapping[str, torch.Tensor]) -> Dict[str, Any]:
    """Under a compute dtype, every base ``nn.Linear`` output seen in ``outputs`` (module key -> first output,
    corruption.forward_logits) in it; failures go to ``promise.failures``."""
    if promise.compute is None:
        return {}
    keys = {clean_name(n + ".").rstrip(".") for n, _ in _base_linears(model)}
    seen = {k: t.dtype for k, t in outputs.items() if k in keys and torch.is_floating_point(t)}
    wrong = sorted(k for k, d in seen.items() if d != promise.compute)
    if wrong:
        promise.failures.append(
            f"dtypes: {len(wrong)}/{len(seen)} base linear layers computed in another dtype than "
            f"{dtype_name(promise.compute)} ({promise.setting}), e.g. {wrong[0]} in {dtype_name(seen[wrong[0]])}"
        )
    return {"compute": dtype_name(promise.compute), "compute_checked": len(seen), "compute_wrong": len(wrong)}


def check_optimizer(optimizer: Any) -> Tuple[Dict[str, Any], List[str]]:
    """Every floating optimizer state tensor in its parameter's dtype (AdamW keeps its moments in it): (checks,
    failures). ``optimizer`` may be accelerate's AcceleratedOptimizer. Not collective."""
    inner = getattr(optimizer, "optimizer", optimizer)
    wrong, counted = [], 0
    for group in inner.param_groups:
        for param in group["params"]:
            for key, value in inner.state.get(param, {}).items():
                if not isinstance(value, torch.Tensor) or not torch.is_floating_point(value) or value.dim() == 0:
                    continue  # AdamW's ``step`` is a float32 scalar whatever the parameter's dtype
                counted += 1
                if value.dtype != param.dtype:
                    wrong.append(f"{key} {dtype_name(value.dtype)} for a {dtype_name(param.dtype)} parameter")
    failures = [
        f"dtypes: {len(wrong)}/{counted} optimizer state tensors not in their parameter's dtype: {w}" for w in wrong[:1]
    ]
    return {"optimizer_state": counted, "optimizer_state_wrong": len(wrong)}, failures
