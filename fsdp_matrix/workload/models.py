"""Tiny random-init transformers models, built from configs (never downloaded), in a given dtype or in 4-bit."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

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

    The scratch folder is this node's: its local rank 0 saves (every node does, into its own), as a model a
    multi-node user loads is on each machine's disk.

    ``storage`` is the dtype the packed 4-bit weights are stored in (``uint8``, bitsandbytes' default, or a float
    dtype name such as ``bf16``, which FSDP can flatten). Raises if the load did not produce ``Linear4bit`` layers:
    such a cell would not test 4-bit at all.
    """
    dtype = torch_dtype(compute_dtype)
    path = save_once(
        ctx,
        f"{name}-{compute_dtype}-seed{ctx.seed}",
        lambda out: save_model_files(build_model(name, compute_dtype, replace(ctx, device=torch.device("cpu"))), out),
    )
    storage_dtype = torch.uint8 if storage == "uint8" else torch_dtype(storage)
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=storage_dtype)
    _, cls = _config(name)
    device_map = {"": ctx.device.index} if ctx.device.type == "cuda" else "cpu"
    model = cls.from_pretrained(path, quantization_config=quant, device_map=device_map, **{_dtype_kwarg(): dtype})
    if count_linear4bit(model) == 0:
        raise RuntimeError(f"4-bit load of {name} produced no bitsandbytes Linear4bit layers")
    return model


def save_once(ctx: RankContext, name: str, save: Callable[[Path], Any], marker: str = "config.json") -> Path:
    """``ctx.scratch / name``, written by ``save(path)`` on this node's local rank 0 unless it is there already;
    every rank of the node waits for it (a barrier over the whole group, so the other nodes' writers finish too).
    A failed save raises on the writer; the others raise on the missing files instead of hanging.

    Per node, never rank 0 alone: on several machines each node has its own scratch, and a file only rank 0
    wrote would be missing on every other node. Whole or absent: ``save`` writes into a
    temporary directory beside ``path``, renamed to ``path`` once it returned, because savers write their first
    file (``marker``, e.g. config.json) long before their last, and a save that failed half way (a full disk, a
    kill) must never be where the next cell looks."""
    path = ctx.scratch / name
    failed = None
    if ctx.is_local_main and not (path / marker).exists():
        try:
            _save_whole(save, path)
        except Exception as exc:  # reach the barrier anyway, so the other ranks fail on the missing files, not hang
            failed = exc
    if dist.is_initialized():
        dist.barrier()
    if failed is not None:
        raise failed
    return path


def _save_whole(save: Callable[[Path], Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        save(tmp)
        shutil.rmtree(path, ignore_errors=True)  # a leftover from before whole saves: never reused
        os.rename(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after the rename; a failed save's leftovers otherwise


def save_model_files(model: nn.Module, path: Path) -> None:
    """``config.json`` and ``model.safetensors`` of a transformers model, as ``save_pretrained`` writes them, on
    whichever rank calls it. transformers 5's ``save_pretrained`` writes nothing on a rank other than global rank 0
    once a process group is up (``should_save_on_this_rank``, whatever ``is_main_process`` says; observed on 5.23),
    so it cannot fill another node's scratch.

    Tied weights are stored once, under the name ``save_pretrained`` keeps: the one not in the model's
    ``_tied_weights_keys`` (Gemma: ``model.embed_tokens.weight``, not ``lm_head.weight``). safetensors' own
    ``save_model`` keeps ``lm_head.weight`` instead, and transformers 4.57.6 then left ``embed_tokens`` on the meta
    device even in a plain ``from_pretrained`` (observed 2026-11-27; 4.46.3 and 5.23.0 loaded it)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(path)
    save_file(unaliased_state_dict(model), str(path / "model.safetensors"), metadata={"format": "pt"})


def unaliased_state_dict(model: nn.Module) -> Dict[str, torch.Tensor]:
    """``model``'s state dict with each storage under one name, preferring names outside ``_tied_weights_keys``
    (a list before transformers 5, a dict of tied name -> source after), each tensor contiguous."""
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    state = model.state_dict()
    owner: Dict[Tuple[int, Tuple[int, ...]], str] = {}
    for name in sorted(state, key=lambda n: n in tied):  # stable: untied names claim their storage first
        tensor = state[name]
        key = (tensor.data_ptr(), tuple(tensor.shape)) if tensor.numel() else (id(tensor), ())
        owner.setdefault(key, name)
    kept = set(owner.values())
    return {name: tensor.contiguous() for name, tensor in state.items() if name in kept}


def count_linear4bit(model: nn.Module) -> int:
    """Number of bitsandbytes ``Linear4bit`` modules."""
    return sum(isinstance(m, Linear4bit) for m in model.modules())


def linear4bit_layers(model: nn.Module) -> Dict[str, nn.Module]:
    """Every bitsandbytes ``Linear4bit`` module (the 4-bit base layers), by name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, Linear4bit)}


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
