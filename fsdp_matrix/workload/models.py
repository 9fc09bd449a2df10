"""Tiny random-init transformers models, built from configs (never downloaded), in a given dtype or in 4-bit."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
import transformers
from bitsandbytes.nn import Linear4bit
from torch import distributed as dist
from torch import nn
from transformers import BitsAndBytesConfig, GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM

from fsdp_matrix.workload.context import RankContext

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The dtype axis values of matrix.yaml and the torch dtypes they name."""

VOCAB = 128
"""Vocabulary size of every tiny model; the synthetic batch draws token ids below it."""

TINY_SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=64,
    use_cache=False,
)
"""Config keywords every tiny model shares (a repro building another architecture starts from these)."""


def _config(name: str):
    if name == "llama":
        return LlamaConfig(**TINY_SHAPE), LlamaForCausalLM
    if name == "gemma":
        # Gemma's head_dim is a free parameter (256 by default); keep it hidden / heads so the model stays tiny
        return GemmaConfig(head_dim=16, **TINY_SHAPE), GemmaForCausalLM
    raise ValueError(f"unknown model {name!r} (expected llama or gemma)")


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (expected one of {', '.join(DTYPES)})") from None


def build_model(name: str, dtype: str, ctx: RankContext) -> nn.Module:
    """A random-init model with identical weights on every rank, on ``ctx.device``, every parameter in ``dtype``."""
    config, cls = _config(name)
    torch.manual_seed(ctx.seed)
    # init in fp32 then cast: the same weights for every dtype, and no reliance on from_config's dtype argument,
    # whose name changed across transformers releases
    model = cls(config)
    return model.to(device=ctx.device, dtype=torch_dtype(dtype))


def _dtype_kwarg() -> str:
    # transformers >= 4.56 calls it ``dtype`` and warns on ``torch_dtype``; older releases only know ``torch_dtype``
    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def build_4bit_model(name: str, compute_dtype: str, storage: str, ctx: RankContext) -> nn.Module:
    """The same tiny model saved once to ``ctx.scratch`` and loaded back through bitsandbytes 4-bit quantization.

    ``storage`` is the dtype the packed 4-bit weights are stored in (``uint8``, bitsandbytes' default, or a float
    dtype name such as ``bf16``, which FSDP can flatten). Raises if the load did not produce ``Linear4bit`` layers:
    such a cell would not test 4-bit at all.
    """
    dtype = torch_dtype(compute_dtype)
    path = ctx.scratch / f"{name}-{compute_dtype}-seed{ctx.seed}"
    failed = None
    if ctx.is_main and not path.exists():
        try:
            _save_whole(build_model(name, compute_dtype, replace(ctx, device=torch.device("cpu"))), path)
        except Exception as exc:  # reach the barrier anyway, so the other ranks fail on the missing files, not hang
            failed = exc
    if dist.is_initialized():
        dist.barrier()
    if failed is not None:
        raise failed
    storage_dtype = torch.uint8 if storage == "uint8" else torch_dtype(storage)
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=storage_dtype)
    _, cls = _config(name)
    device_map = {"": ctx.device.index} if ctx.device.type == "cuda" else "cpu"
    model = cls.from_pretrained(path, quantization_config=quant, device_map=device_map, **{_dtype_kwarg(): dtype})
    if count_linear4bit(model) == 0:
        raise RuntimeError(f"4-bit load of {name} produced no bitsandbytes Linear4bit layers")
    return model


def _save_whole(model: nn.Module, path: Path) -> None:
    """``save_pretrained`` into a temporary directory beside ``path``, renamed to ``path`` once complete: ``path``
    exists only as a whole save. save_pretrained writes config.json first, so a save that failed half way (a full
    disk, a kill) must never be where the next cell looks for a saved model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        model.save_pretrained(tmp)
        os.rename(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after the rename; a failed save's leftovers otherwise


def count_linear4bit(model: nn.Module) -> int:
    """Number of bitsandbytes ``Linear4bit`` modules."""
    return sum(isinstance(m, Linear4bit) for m in model.modules())


def decoder_layer_class(model: nn.Module) -> type:
    """The decoder-layer class of a (possibly PEFT-wrapped) transformers model, e.g. ``LlamaDecoderLayer``."""
    for module in model.modules():
        if type(module).__name__.endswith("DecoderLayer"):
            return type(module)
    raise ValueError(f"no *DecoderLayer module in {type(model).__name__}")


def decoder_layers(model: nn.Module) -> list:
    """Every decoder layer of the model, in order."""
    cls = decoder_layer_class(model)
    return [m for m in model.modules() if isinstance(m, cls)]
