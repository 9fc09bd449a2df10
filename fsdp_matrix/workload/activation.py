"""Activation checkpointing as users turn it on: the ``ac`` axis of matrix.yaml, read by every entry.

- ``none`` (also a cell without the axis): no checkpointing.
- ``fsdp``: accelerate's ``fsdp_activation_checkpointing``. The ``accelerate`` entry sets
  ``FullyShardedDataParallelPlugin(activation_checkpointing=True)`` (and ``FSDP_ACTIVATION_CHECKPOINTING=true``, as
  ``accelerate config`` exports it: accelerate <= 0.29 reads some fields only from there); the ``trainer`` and
  ``trl`` entries ``fsdp_config={"activation_checkpointing": True}``, which the Trainer hands to accelerate. accelerate
  then wraps, with torch's ``checkpoint_wrapper`` (non-reentrant), every module its plugin's auto-wrap policy selects:
  after ``FullyShardedDataParallel`` for FSDP1 (``Accelerator.prepare_model``), before ``fully_shard`` for FSDP2
  (``fsdp2_apply_ac``). The ``torch`` entry (FSDP called directly) does what torch's FSDP docs do:
  ``apply_activation_checkpointing`` on the decoder layers, after wrapping (FSDP1) or before ``fully_shard`` (FSDP2).
- ``hf_reentrant`` / ``hf_nonreentrant``: transformers' own checkpointing,
  ``model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True/False})`` on the PEFT
  model before wrapping (``torch`` and ``accelerate`` entries), or ``TrainingArguments(gradient_checkpointing=True,
  gradient_checkpointing_kwargs={"use_reentrant": ...})`` (``trainer``, ``trl``: the Trainer turns it on itself).
  Every transformers the combos pin has both (``gradient_checkpointing_kwargs`` since 4.35). Nothing else is done
  for the user: a reentrant checkpoint whose inputs are frozen builds no graph unless someone calls
  ``enable_input_require_grads()`` (peft#1577, transformers#42489), and that is what such a cell meets.

What the structural check then expects (units.py, ``StructurePromise.checkpoint_kind``): ``fsdp``: every decoder
layer inside a ``CheckpointWrapper`` and nothing else wrapped, no transformers flag; ``hf``: no wrapper, and every
decoder layer under a module with transformers' ``gradient_checkpointing`` flag on (the layer itself in transformers
5, the decoder stack in 4.x); ``none``: nothing wrapped or flagged.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

import torch
from torch import nn

from fsdp_matrix.workload.models import decoder_layer_class, decoder_layers
from fsdp_matrix.workload.params import axis

ACS = ("none", "fsdp", "hf_reentrant", "hf_nonreentrant")
"""The ``ac`` axis values."""
AC_REENTRANT = {"hf_reentrant": True, "hf_nonreentrant": False}
"""``use_reentrant`` of each ``hf_*`` value."""
AC_ENV = "FSDP_ACTIVATION_CHECKPOINTING"
"""What ``accelerate config`` exports for ``fsdp_activation_checkpointing: true``."""


def ac_of(params: Mapping[str, Any]) -> str:
    """The cell's ``ac`` value (``none`` when the axis is absent); UnknownAxisValue for another."""
    return axis(params, "ac", ACS, default="none")


def ac_kind(params: Optional[Mapping[str, Any]]) -> Optional[str]:
    """What the structural check expects: ``fsdp``, ``hf``, ``none``; None where the cell has no ``ac`` axis (its
    checkpointing, if any, comes from elsewhere: a case's own ``gc`` axis, an entry setting)."""
    if params is None or "ac" not in params:
        return None
    ac = ac_of(params)
    return "hf" if ac in AC_REENTRANT else ac


def enable_hf_ac(model: nn.Module, params: Mapping[str, Any]) -> None:
    """``hf_*``: ``gradient_checkpointing_enable`` with the value's ``use_reentrant``, as a user of the ``torch`` or
    ``accelerate`` entry calls it on the PEFT model (PeftModel forwards it to the transformers model)."""
    ac = ac_of(params)
    if ac not in AC_REENTRANT:
        return
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": AC_REENTRANT[ac]})


def ac_plugin_kwargs(params: Mapping[str, Any], fields: set) -> Dict[str, Any]:
    """``FullyShardedDataParallelPlugin`` keyword arguments for ``fsdp`` (exported to the environment too, as
    ``accelerate config`` does); ValueError where this accelerate's plugin has no such field."""
    if ac_of(params) != "fsdp":
        return {}
    if "activation_checkpointing" not in fields:
        raise ValueError("this accelerate's FullyShardedDataParallelPlugin has no activation_checkpointing")
    os.environ[AC_ENV] = "true"
    return {"activation_checkpointing": True}


def ac_fsdp_config(params: Mapping[str, Any]) -> Dict[str, Any]:
    """The Trainer's ``fsdp_config`` entries for ``fsdp``."""
    return {"activation_checkpointing": True} if ac_of(params) == "fsdp" else {}


def ac_trainer_kwargs(params: Mapping[str, Any]) -> Dict[str, Any]:
    """``TrainingArguments`` keyword arguments for ``hf_*`` (none for a cell without the axis)."""
    ac = ac_of(params)
    if ac not in AC_REENTRANT:
        return {}
    return {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": AC_REENTRANT[ac]}}


def torch_fsdp_ac(model: nn.Module) -> None:
    """The ``torch`` entry's ``fsdp``: torch's ``apply_activation_checkpointing`` (non-reentrant
    ``checkpoint_wrapper``, as accelerate builds it) on each decoder layer, in place."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    layer = decoder_layer_class(model)
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: isinstance(m, layer),
    )


@dataclass
class AttentionCalls:
    """How often the decoder layers' attention ran, counted by ``count_attention_calls``'s hooks."""

    forward: int = 0
    """Calls outside a backward pass (the forwards, the harness's checks' included)."""
    in_backward: int = 0
    """Calls inside a backward pass: activation checkpointing's recompute, and nothing else."""

    @property
    def total(self) -> int:
        return self.forward + self.in_backward


def count_attention_calls(model: nn.Module) -> AttentionCalls:
    """Counts, from now on, every call of each decoder layer's ``self_attn``, inside a backward pass or not: whether
    checkpointing is really on, whatever the flags say. The hook sits on the attention module, not the layer:
    transformers 5 checkpoints the layer's ``forward``, not its ``__call__``, so the layer's own hooks miss the
    recompute (and a CheckpointWrapper around the layer is outside the attention)."""
    calls = AttentionCalls()

    def hook(*_: Any) -> None:
        # -1 outside autograd's engine; a graph task id inside a backward pass
        if torch._C._current_graph_task_id() != -1:
            calls.in_backward += 1
        else:
            calls.forward += 1

    for layer in decoder_layers(model):
        layer.self_attn.register_forward_pre_hook(hook)
    return calls
