"""The knobs every real config turns: gradient accumulation, gradient clipping, torch.compile (the ``accum``,
``clip`` and ``compile`` axes of matrix.yaml), read the way each entry's users set them.

- ``torch`` (FSDP called directly): ``accum`` micro-batches per optimizer step, every one but the last under
  ``no_sync()`` (FSDP1) or ``set_requires_gradient_sync(False)`` (FSDP2); ``clip`` through FSDP1's own
  ``clip_grad_norm_`` or ``torch.nn.utils.clip_grad_norm_`` (FSDP2); ``compile`` in place after wrapping, as FSDP2's
  documentation does it (``regional``: each decoder layer's ``.compile()``, ``whole``: the model's).
- ``accelerate``: ``Accelerator(gradient_accumulation_steps=...)`` with ``accumulate(model)`` around each
  micro-step, ``accelerator.clip_grad_norm_``, ``TorchDynamoPlugin`` (``regional``: ``use_regional_compilation``).
- ``trainer`` / ``trl``: ``TrainingArguments(gradient_accumulation_steps, max_grad_norm, torch_compile)``, and the
  Trainer's own loop (``regional``: accelerate's ``ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION``, which an
  ``accelerate launch`` config with regional compilation exports, read by the Trainer's TorchDynamoPlugin).

``backend="eager"`` on CPU (no compiler needed), inductor on CUDA. A cell without an axis runs as it always did.

A ``compile`` cell must have compiled something (``CompileProbe``): with dynamo disabled (``TORCH_COMPILE_DISABLE=1``,
``TORCHDYNAMO_DISABLE=1``, a library that sets ``torch._dynamo.config.disable``) the model runs eagerly, every check
holds, and a cell about a compile bug passed in 1.3 s instead of 10.9 s (reliability review 2026-11-28, defect 4).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
from torch import nn

from fsdp_matrix.workload.activation import ac_of, ac_trainer_kwargs
from fsdp_matrix.workload.models import decoder_layers
from fsdp_matrix.workload.params import axis

ACCUMS = (1, 2)
"""The ``accum`` axis values: micro-batches per optimizer step (the synthetic batch of 2 rows splits in 2)."""
CLIPS = ("none", 1.0)
"""The ``clip`` axis values: no clipping, or ``max_norm=1.0``."""
COMPILES = ("none", "regional", "whole")
"""The ``compile`` axis values: no compile, each decoder layer compiled, the whole model compiled."""
KNOB_AXES = ("accum", "clip", "compile", "ac")
"""The axes this module reads."""


@dataclass(frozen=True)
class Knobs:
    """A cell's knobs; the defaults are a cell without the axes."""

    accum: int = 1
    """Micro-batches per optimizer step (``gradient_accumulation_steps``)."""
    clip: Optional[float] = None
    """``max_norm`` of the entry's ``clip_grad_norm_``; None: no clipping."""
    compile: str = "none"
    """``none``, ``regional`` or ``whole``."""
    ac: str = "none"
    """Activation checkpointing (activation.py): ``none``, ``fsdp``, ``hf_reentrant``, ``hf_nonreentrant``."""
    given: Tuple[str, ...] = ()
    """The knob axes the cell has (an entry changes its defaults only for those, e.g. the Trainer's max_grad_norm)."""


def knobs_of(params: Mapping[str, Any]) -> Knobs:
    """The cell's knobs; UnknownAxisValue for a value not handled here."""
    clip = axis(params, "clip", CLIPS, default="none")
    return Knobs(
        accum=axis(params, "accum", ACCUMS, default=1),
        clip=None if clip == "none" else float(clip),
        compile=axis(params, "compile", COMPILES, default="none"),
        ac=ac_of(params),
        given=tuple(n for n in KNOB_AXES if n in params),
    )


def backend_for(device: torch.device) -> str:
    """The dynamo backend: ``eager`` on CPU (no compiler needed), ``inductor`` elsewhere."""
    return "eager" if device.type == "cpu" else "inductor"


def micro_batches(batch: torch.Tensor, accum: int) -> List[torch.Tensor]:
    """``batch`` split into ``accum`` micro-batches along its rows (the whole batch for 1)."""
    if accum == 1:
        return [batch]
    if batch.shape[0] % accum:
        raise ValueError(f"a batch of {batch.shape[0]} rows does not split into {accum} micro-batches")
    return list(batch.chunk(accum))


@contextlib.contextmanager
def torch_sync(model: nn.Module, last: bool) -> Iterator[None]:
    """A micro-step of the ``torch`` entry: gradient sync deferred on every micro-step but the last."""
    if last:
        yield
    elif hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        with model.no_sync():
            yield


def torch_clip(model: nn.Module, max_norm: float) -> torch.Tensor:
    """The ``torch`` entry's clip: FSDP1's ``clip_grad_norm_`` (it reduces over the shards), else torch's."""
    own = getattr(model, "clip_grad_norm_", None)
    if own is not None:
        return own(max_norm)
    return torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], max_norm)


def torch_compile(model: nn.Module, how: str, device: torch.device) -> None:
    """Compile the wrapped model in place (``nn.Module.compile``): each decoder layer, or the whole model."""
    if how == "none":
        return
    backend = backend_for(device)
    targets = decoder_layers(model) if how == "regional" else [model]
    for module in targets:
        module.compile(backend=backend)


def dynamo_kwargs(knobs: Knobs, device: torch.device) -> Dict[str, Any]:
    """``Accelerator`` keyword arguments for ``compile``: a ``TorchDynamoPlugin`` (``regional``: with
    ``use_regional_compilation=True``, which this accelerate may refuse with its TypeError, as it would a user)."""
    if knobs.compile == "none":
        return {}
    from accelerate import Accelerator
    from accelerate.utils import TorchDynamoPlugin

    backend = backend_for(device)
    if "dynamo_plugin" not in inspect.signature(Accelerator.__init__).parameters:
        if knobs.compile == "regional":
            raise TypeError("this accelerate has no dynamo_plugin argument, so no regional compilation")
        return {"dynamo_backend": backend}
    extra = {"use_regional_compilation": True} if knobs.compile == "regional" else {}
    return {"dynamo_plugin": TorchDynamoPlugin(backend=backend, **extra)}


def accelerate_kwargs(knobs: Knobs, device: torch.device) -> Dict[str, Any]:
    """Every ``Accelerator`` keyword argument the knobs add."""
    extra = dynamo_kwargs(knobs, device)
    if "accum" in knobs.given:
        extra["gradient_accumulation_steps"] = knobs.accum
    return extra


def trainer_kwargs(knobs: Knobs, device: torch.device) -> Dict[str, Any]:
    """``TrainingArguments`` keyword arguments for the knobs the cell has. ``clip`` ``none`` is ``max_grad_norm=0``
    (the Trainer clips at 1.0 by default); ``regional`` also exports accelerate's env switch (see the module doc);
    ``ac`` ``hf_*`` is ``gradient_checkpointing=True`` with its ``use_reentrant``, any other ``ac`` value
    ``gradient_checkpointing=False`` (``fsdp`` goes in ``fsdp_config``: hf_trainer.trainer_fsdp_config)."""
    kwargs: Dict[str, Any] = {}
    if "accum" in knobs.given:
        kwargs["gradient_accumulation_steps"] = knobs.accum
    if "clip" in knobs.given:
        kwargs["max_grad_norm"] = knobs.clip or 0.0
    if knobs.compile != "none":
        kwargs.update(torch_compile=True, torch_compile_backend=backend_for(device))
    if knobs.compile == "regional":
        os.environ["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = "true"
    if "ac" in knobs.given:
        # explicit for every value: TRL's configs turn gradient_checkpointing on by default in some releases
        kwargs.update(ac_trainer_kwargs({"ac": knobs.ac}) or {"gradient_checkpointing": False})
    return kwargs


def compiled_frames() -> Optional[int]:
    """Frames dynamo compiled in this process so far: ``torch._dynamo.utils.counters["frames"]["ok"]`` (a
    ``defaultdict(Counter)``, counted on every successful frame conversion from torch 2.0 to 2.13 at least); None
    where this torch has no such counter."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["frames"]["ok"])
    except (ImportError, KeyError, TypeError):
        return None


@dataclass
class CompileProbe:
    """Whether a ``compile`` cell compiled anything: ``start`` before the cell's first forward of the wrapped model,
    ``judge`` after training."""

    how: str
    """The cell's ``compile`` knob; ``none``: nothing judged."""
    before: Optional[int] = None
    """``compiled_frames()`` at the start."""

    @classmethod
    def start(cls, knobs: Knobs) -> CompileProbe:
        if knobs.compile == "none":
            return cls("none")
        import torch._dynamo

        # a cold cache, as the cell would have alone: dynamo keeps compiled code per code object, so a later cell of
        # the same launch with the same model classes could run an earlier cell's code and compile nothing itself
        # (or meet the recompile limit and run eagerly)
        torch._dynamo.reset()
        return cls(knobs.compile, compiled_frames())

    def judge(self) -> Tuple[Dict[str, Any], List[str]]:
        """(``{"compiled_frames": n}``, failures): a compile cell that compiled 0 frames fails."""
        if self.how == "none":
            return {}, []
        now = compiled_frames()
        if now is None or self.before is None:
            why = "this torch has no torch._dynamo.utils.counters['frames']"
            return {"compiled_frames": None}, [f"compile: cannot tell whether dynamo compiled anything ({why})"]
        frames = now - self.before
        if frames > 0:
            return {"compiled_frames": frames}, []
        return {"compiled_frames": frames}, [
            f"compile: the cell asked compile {self.how} and dynamo compiled 0 frames (disabled by "
            "TORCH_COMPILE_DISABLE / TORCHDYNAMO_DISABLE or torch._dynamo.config.disable?): nothing it promises ran"
        ]


def _no_context(model: nn.Module, last: bool) -> ContextManager[None]:
    return contextlib.nullcontext()


@dataclass
class Loop:
    """How an entry runs one optimizer step: its micro-steps and its clip, for the cell's knobs."""

    knobs: Knobs = field(default_factory=Knobs)
    """The cell's knobs."""
    micro: Callable[[nn.Module, bool], ContextManager[None]] = torch_sync
    """``micro(model, last)``: the context of one micro-step's forward and backward."""
    clip: Callable[[nn.Module, float], Any] = torch_clip
    """``clip(model, max_norm)``, called after the last micro-step when ``knobs.clip`` is set."""
    scale: bool = True
    """Divide each micro-step's loss by ``accum`` (False where the entry's backward does, as accelerate's)."""

    @classmethod
    def for_torch(cls, params: Mapping[str, Any]) -> Loop:
        """The ``torch`` entry's loop for the cell's knobs."""
        return cls(knobs_of(params))

    @classmethod
    def for_accelerate(cls, accelerator: Any, params: Mapping[str, Any]) -> Loop:
        """accelerate's: ``accumulate(model)`` around each micro-step (where the cell has ``accum``; a cell without
        it runs as before), ``accelerator.clip_grad_norm_``; ``accelerator.backward`` divides the loss itself."""
        knobs = knobs_of(params)

        def micro(model: nn.Module, last: bool) -> ContextManager[None]:
            return accelerator.accumulate(model)

        def clip(model: nn.Module, max_norm: float) -> Any:
            return accelerator.clip_grad_norm_(model.parameters(), max_norm)

        return cls(knobs, micro if "accum" in knobs.given else _no_context, clip, scale=False)
