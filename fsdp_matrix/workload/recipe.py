"""A cell's params turned into a PEFT model: the base (plain or 4-bit) plus its adapter, ready to wrap."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Tuple

from torch import nn

from fsdp_matrix.workload.activation import ac_of, enable_hf_ac, torch_fsdp_ac
from fsdp_matrix.workload.adapters import adapter_dtypes, add_adapter
from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.entry import accelerate_train_and_check, entry_of
from fsdp_matrix.workload.hf_trainer import trainer_entry
from fsdp_matrix.workload.launcher import checkpoint_model, fsdp_launch_config, launched_model
from fsdp_matrix.workload.meta_init import FROM_RANK0, SYNC_SHIM, build_rank0_model, init_of, reference_for
from fsdp_matrix.workload.models import DTYPES, _config, build_4bit_model, build_model, count_linear4bit, torch_dtype
from fsdp_matrix.workload.params import axis, flag
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.trl_trainer import trl_entry_from_peft  # imports trl only when a trl cell runs
from fsdp_matrix.workload.wrapping import MIXED_PRECISION, SHARDING, WRAPS, wrap

ADAPTERS = ("lora", "dora", "qlora")
"""The ``adapter`` values a PEFT model is built for here (other adapters build their own)."""
MODELS = ("llama", "gemma")
"""The ``model`` values build_model knows."""
STORAGES = ("uint8", "bf16")
"""The ``storage`` values (4-bit quant_storage) build_4bit_model knows."""


def peft_model(params: Mapping[str, Any], ctx: RankContext, autocast: Optional[bool] = None) -> nn.Module:
    """Base model from ``model``/``dtype`` (4-bit with ``storage`` when ``adapter`` is ``qlora``) plus the adapter.

    ``autocast`` (``autocast_adapter_dtype``) comes from the ``autocast`` axis when the cell has one, else from the
    argument; None keeps PEFT's default. ``init`` ``ram_efficient``: only rank 0 loads real weights, the other ranks
    build on meta (meta_init.py); ``launcher``: every rank calls ``from_pretrained`` under the environment
    ``accelerate launch`` exports for the cell's FSDP config, and transformers decides what ranks > 0 hold
    (launcher.py). PEFT then adds its adapter on each rank as it does for users.
    """
    adapter = axis(params, "adapter", ADAPTERS)
    dtype, model = axis(params, "dtype", tuple(DTYPES), default="fp32"), axis(params, "model", MODELS)
    init = init_of(params)
    if adapter == "qlora":
        if init != "full":
            raise ValueError(f"init {init} is built for plain bases only; the qlora adapter takes init full")
        base = build_4bit_model(model, dtype, axis(params, "storage", STORAGES, default="uint8"), ctx)
    elif init == "ram_efficient":
        base = build_rank0_model(model, dtype, ctx)
    elif init == "launcher":
        base = launched_model(model, dtype, cell_launch_config(params, ctx), ctx)
    else:
        base = build_model(model, dtype, ctx)
    if "autocast" in params:
        autocast = flag(params, "autocast")
    return add_adapter(base, adapter, ctx.seed, autocast=autocast)


def reference_source(params: Mapping[str, Any], ctx: RankContext) -> Optional[Callable[[], nn.Module]]:
    """``init: launcher``: what the forward check's reference is taken from, the saved checkpoint loaded plainly
    plus the same adapter (launcher.checkpoint_model says why); other inits: None, the cell's own model."""
    if init_of(params) != "launcher":
        return None
    dtype, model = axis(params, "dtype", tuple(DTYPES), default="fp32"), axis(params, "model", MODELS)
    autocast = flag(params, "autocast") if "autocast" in params else None
    adapter = axis(params, "adapter", ADAPTERS)
    return lambda: add_adapter(checkpoint_model(model, dtype, ctx), adapter, ctx.seed, autocast)


def cell_launch_config(params: Mapping[str, Any], ctx: RankContext) -> dict:
    """The ``accelerate config`` yaml of a launched user for the cell's ``model``/``wrap``/``orig`` axes
    (launcher.fsdp_launch_config)."""
    _, cls = _config(axis(params, "model", MODELS))
    layer = ",".join(cls._no_split_modules)  # what users write: LlamaDecoderLayer, GemmaDecoderLayer
    version = 2 if axis(params, "wrap", WRAPS) in ("fsdp2", "fsdp2_root") else 1
    return fsdp_launch_config(layer, version, bool(flag(params, "orig", default=False)), ctx.world_size)


def base_model(params: Mapping[str, Any], ctx: RankContext) -> nn.Module:
    """The plain base of the ``model`` and ``dtype`` axes (``dtype`` fp32 when absent), the same on every rank."""
    return build_model(axis(params, "model", MODELS), axis(params, "dtype", tuple(DTYPES), default="fp32"), ctx)


def wrap_cell(model: nn.Module, params: Mapping[str, Any], ctx: RankContext) -> nn.Module:
    """``model`` wrapped as the ``wrap`` axis says (FSDP1 or FSDP2), ``use_orig_params`` from the ``orig`` axis
    (absent: the wrapper's default); the shard, mixed-precision and init axes are wrap_and_train's."""
    return wrap(model, axis(params, "wrap", WRAPS), flag(params, "orig", default=None), ctx)


def wrap_cell_and_train(
    model: nn.Module, params: Mapping[str, Any], ctx: RankContext, steps: int = 3
) -> Tuple[nn.Module, dict]:
    """``model`` wrapped by ``wrap_cell`` and trained ``steps`` steps with every check (``train_and_check``, the
    trainable set taken before wrapping, no forward reference): the wrapped model, for what the repro does next
    (save, merge, take a state dict), and the checks. The ``entry``, ``init``, ``shard`` and ``mp`` axes are
    ``wrap_and_train``'s."""
    trainable = trainable_names(model)
    wrapped = wrap_cell(model, params, ctx)
    return wrapped, train_and_check(wrapped, ctx, steps=steps, trainable=trainable)


def wrap_and_train(model: nn.Module, params: Mapping[str, Any], ctx: RankContext) -> dict:
    """Wrap per the ``entry``/``wrap``/``orig`` axes, train, check; the checks also say what was built.

    ``entry`` (absent: ``torch``) is how FSDP is reached: FSDP called directly, accelerate's ``prepare``, a
    transformers Trainer, or TRL's SFTTrainer given the adapter's config (entry.py, hf_trainer.py, trl_trainer.py).
    The trainable set is taken here, from the PEFT model's ``requires_grad`` before wrapping, so the checks judge
    every tensor against what PEFT made trainable, whatever the wrapper does (``trl``: from TRL's own PEFT model).
    So is the reference of the forward and sharding checks (corruption.py): every entry takes it from the model
    before wrapping (``init`` ``ram_efficient``: from rank 0's real weights, broadcast). ``init`` also says how
    ranks > 0 get their weights (meta_init.py).
    """
    built = {"adapter_dtypes": adapter_dtypes(model), "linear4bit": count_linear4bit(model)}
    trainable = trainable_names(model)
    entry = entry_of(params)
    init = init_of(params)
    if init != "full":
        built["init"] = init
    if entry == "trl":
        return {**built, **trl_entry_from_peft(model, params, ctx)}
    reference = reference_for(model, synthetic_batch(ctx), ctx, params, source=reference_source(params, ctx))
    if entry == "accelerate":
        return {**built, **accelerate_train_and_check(model, params, ctx, trainable, reference)}
    if entry == "trainer":
        return {**built, **trainer_entry(model, params, ctx, trainable, reference)}
    kind = axis(params, "wrap", WRAPS)
    # ac: transformers' checkpointing before wrapping; torch's wrapper as accelerate places it (activation.py)
    enable_hf_ac(model, params)
    if ac_of(params) == "fsdp" and kind == "fsdp2":
        torch_fsdp_ac(model)
    wrapped = wrap(
        model,
        kind,
        flag(params, "orig", default=None),
        ctx,
        shard=axis(params, "shard", tuple(SHARDING), default="full"),
        mp=axis(params, "mp", tuple(MIXED_PRECISION), default=None),
        init=init,
    )
    if ac_of(params) == "fsdp" and kind != "fsdp2":
        torch_fsdp_ac(wrapped)
    # params: the collectives check judges what the cell's wrap and shard axes promise (collectives.Promise)
    checks = train_and_check(wrapped, ctx, trainable=trainable, reference=reference, params=params)
    if init in FROM_RANK0 and ctx.device.type == "cpu" and checks.get("wrapper") == "fsdp1":
        checks["shim"] = [SYNC_SHIM]
    return {**built, **checks}


def base_dtype_name(params: Mapping[str, Any]) -> str:
    """``torch.bfloat16`` etc. for the cell's ``dtype`` axis (fp32 when absent)."""
    return str(torch_dtype(axis(params, "dtype", tuple(DTYPES), default="fp32")))
