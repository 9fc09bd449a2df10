"""PEFT adapters on the tiny models: LoRA, DoRA, and LoRA on a 4-bit base (QLoRA)."""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch
from peft import LoraConfig, get_peft_model
from torch import nn

TARGET_MODULES = ["q_proj", "v_proj"]
"""Adapted projections: PEFT's own default for Llama-like models, and few enough FSDP units to stay fast."""

ADAPTER_MARKERS = ("lora_",)
"""Name markers of LoRA/DoRA weights (``lora_A``, ``lora_B``, DoRA's ``lora_magnitude_vector``). Kept for code
written against earlier releases; the checks never use it (they go by ``requires_grad``): other PEFT methods
(modules_to_save, trainable tokens, prompt tuning, IA3, VeRA ...) train tensors without this marker."""


def is_adapter(name: str) -> bool:
    """Whether a name looks like a LoRA/DoRA weight. Not what decides trainability: see ADAPTER_MARKERS."""
    return any(marker in name for marker in ADAPTER_MARKERS)


def has_autocast_option() -> bool:
    """Whether this PEFT's ``get_peft_model`` takes ``autocast_adapter_dtype`` (older releases do not)."""
    return "autocast_adapter_dtype" in inspect.signature(get_peft_model).parameters


def lora_config(
    *, target_modules: Optional[list] = None, task_type: Optional[str] = "CAUSAL_LM", **options
) -> LoraConfig:
    """The LoRA every case uses: rank 4, alpha 8, no dropout, on ``target_modules`` (default TARGET_MODULES).

    ``task_type`` None builds a bare ``PeftModel`` instead of ``PeftModelForCausalLM``. ``options`` go to LoraConfig
    as given (``use_dora``, ``modules_to_save``, ``init_lora_weights``, ``target_parameters``, ...): an option this
    PEFT does not know raises its own TypeError, which some rules expect; ``r``, ``lora_alpha`` and
    ``lora_dropout`` given there replace the defaults.
    """
    modules = list(TARGET_MODULES if target_modules is None else target_modules)
    options = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, **options}
    return LoraConfig(target_modules=modules, task_type=task_type, **options)


def add_adapter(
    model: nn.Module, adapter: str, seed: int, autocast: Optional[bool] = None, **options: Any
) -> nn.Module:
    """``get_peft_model`` with a rank-4 LoRA (``dora``: ``use_dora=True``) on q/v projections.

    ``autocast`` is passed as ``autocast_adapter_dtype`` (True upcasts fp16/bf16 adapter weights to fp32); None
    leaves PEFT's default. Asking for the upcast on a PEFT without the option raises TypeError, as PEFT itself
    would; asking for no upcast there is what that PEFT always did. ``options`` go to ``lora_config`` as given
    (``target_modules``, ``task_type``, ``init_lora_weights``, ``modules_to_save``, ...).
    """
    if adapter not in ("lora", "dora", "qlora"):
        raise ValueError(f"unknown adapter {adapter!r} (expected lora, dora or qlora)")
    config = lora_config(use_dora=adapter == "dora", **options)
    kwargs = {} if autocast is None else {"autocast_adapter_dtype": bool(autocast)}
    if autocast is False and not has_autocast_option():
        # before the option existed PEFT never upcast: leaving it out *is* autocast_adapter_dtype=False there
        kwargs = {}
    # adapter init draws from the global RNG: seed it so every rank builds the same adapter
    torch.manual_seed(seed)
    return get_peft_model(model, config, **kwargs)


def adapter_dtypes(model: nn.Module) -> list:
    """Sorted names of the dtypes the trainable (adapter) weights ended up in, e.g. ``['torch.float32']``."""
    return sorted({str(p.dtype) for p in model.parameters() if p.requires_grad})
