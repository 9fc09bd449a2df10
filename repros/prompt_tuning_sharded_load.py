"""Prompt tuning, FSDP1 sharded load without the prompt: https://github.com/pytorch/pytorch/issues/109077"""

from __future__ import annotations

import shutil
from dataclasses import replace

import torch
import torch.distributed.checkpoint as dcp
from peft import PromptTuningConfig, get_peft_model
from torch import distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType

from fsdp_matrix.case import (
    DTYPES,
    MODELS,
    WRAPS,
    Failures,
    RankContext,
    axis,
    build_model,
    clean_name,
    flag,
    full_parameters,
    main,
    train_and_check,
    trainable_names,
    wrap,
)

CASE = "prompt-tuning-sharded-load"
PROMPT = "prompt_encoder"


def _build(params: dict, ctx: RankContext, base_seed: int):
    base = build_model(
        axis(params, "model", MODELS),
        axis(params, "dtype", tuple(DTYPES), default="fp32"),
        replace(ctx, seed=base_seed),
    )
    torch.manual_seed(ctx.seed)
    return get_peft_model(base, PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))


def _full(model) -> dict:
    return {clean_name(n): t for n, t in full_parameters(model, "fsdp1").items()}


def _sharded_state_dict(model) -> dict:
    with FullyShardedDataParallel.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        return model.state_dict()


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    axis(params, "adapter", ("prompt",))
    orig, strict, kind = flag(params, "orig"), flag(params, "strict"), axis(params, "wrap", WRAPS)
    path = ctx.shared_dir() / f"{CASE}-{kind}-orig{int(orig)}-strict{int(strict)}-seed{ctx.seed}"
    if ctx.is_main:
        shutil.rmtree(path, ignore_errors=True)
    dist.barrier()

    source = wrap(_build(params, ctx, ctx.seed), kind, orig, ctx)
    saved = {k: v for k, v in _sharded_state_dict(source).items() if PROMPT not in k}
    dcp.save(saved, checkpoint_id=str(path))
    source_full = _full(source)
    del source, saved

    peft_model = _build(params, ctx, ctx.seed + 1)
    trainable = trainable_names(peft_model)
    model = wrap(peft_model, kind, orig, ctx)
    fresh = _full(model)
    with FullyShardedDataParallel.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        state = {k: v for k, v in model.state_dict().items() if PROMPT not in k}
        dcp.load(state, checkpoint_id=str(path))
        result = model.load_state_dict(state, strict=strict)
    loaded = _full(model)
    base_names = [n for n in loaded if PROMPT not in n]
    prompt_names = [n for n in loaded if PROMPT in n]
    found = {
        "missing_keys": sorted(clean_name(k) for k in result.missing_keys),
        "unexpected_keys": sorted(clean_name(k) for k in result.unexpected_keys),
        "base_differed_before_load": [n for n in base_names if not torch.equal(fresh[n], source_full[n])],
        "base_not_loaded": [n for n in base_names if not torch.equal(loaded[n], source_full[n])],
        "prompt_changed_by_load": [n for n in prompt_names if not torch.equal(loaded[n], fresh[n])],
    }
    failed = Failures()
    if found["missing_keys"] != prompt_names or found["unexpected_keys"]:
        failed.append(f"load reported missing {found['missing_keys']}, unexpected {found['unexpected_keys']}")
    if not found["base_differed_before_load"]:
        failed.append("B's base weights equalled A's before the load: the load proves nothing")
    if found["base_not_loaded"]:
        failed.append(f"{len(found['base_not_loaded'])} base tensors not loaded: {found['base_not_loaded'][:5]}")
    if found["prompt_changed_by_load"] or not prompt_names:
        failed.append(f"prompt embedding {prompt_names} changed by the load: {found['prompt_changed_by_load']}")
    checks = train_and_check(model, ctx, trainable=trainable)
    checks.update({k: (len(v) if k.startswith("base_") else v) for k, v in found.items()})
    failed.raise_if_any()
    return checks


if __name__ == "__main__":
    main(run, CASE)
