"""set_peft_model_state_dict into an FSDP-wrapped model: https://github.com/huggingface/peft/pull/3212"""

from __future__ import annotations

import torch
from peft import get_peft_model_state_dict, set_peft_model_state_dict
from torch import nn

from fsdp_matrix.case import (
    TOLERANCE,
    Failures,
    RankContext,
    adapter_key,
    fsdp1_full_state_dict,
    gathered_adapter,
    is_adapter,
    logits,
    main,
    peft_model,
    synthetic_batch,
    wrap_cell,
)

CASE = "adapter-load-wrapped"


def source_adapter(params: dict, ctx: RankContext) -> nn.Module:
    """The PEFT model of the cell with every adapter tensor set to seeded random values, the same on every rank
    (a fresh model's ``lora_B`` is zero: loading must visibly change it)."""
    model = peft_model(params, ctx)
    gen = torch.Generator().manual_seed(ctx.seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if is_adapter(name):
                param.copy_(0.1 * torch.randn(param.shape, generator=gen, dtype=torch.float32).to(param))
    return model


def load_into_wrapped(wrapped: nn.Module, state: dict):
    """``set_peft_model_state_dict(wrapped, state)``; FSDP1 under ``FULL_STATE_DICT``, as accelerate does."""
    with fsdp1_full_state_dict(wrapped):
        return set_peft_model_state_dict(wrapped, state)


def _unexpected(result) -> list:
    keys = getattr(result, "unexpected_keys", None)
    if keys is None and isinstance(result, tuple) and len(result) == 2:
        keys = result[1]
    return [k for k in (keys or []) if is_adapter(k)]


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    params = {"adapter": "lora", **params}
    source = source_adapter(params, ctx)
    state = {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(source).items()}
    want = {adapter_key(k): v for k, v in state.items() if is_adapter(k)}
    batch = synthetic_batch(ctx)
    want_logits = logits(source, batch).float()
    del source
    fresh = peft_model(params, ctx)
    wrapped = wrap_cell(fresh, params, ctx)
    result = load_into_wrapped(wrapped, state)
    unexpected = _unexpected(result)
    loaded = gathered_adapter(wrapped)
    got_logits = logits(wrapped, batch).float()
    not_loaded = [
        f"{k} differs from the state dict by max |diff| {float((loaded[k].float() - v.float()).abs().max()):.3g}"
        if k in loaded and loaded[k].shape == v.shape
        else f"{k} not in the wrapped model with shape {list(v.shape)}"
        for k, v in sorted(want.items())
        if not (k in loaded and loaded[k].shape == v.shape and torch.equal(loaded[k], v.to(loaded[k].dtype)))
    ]
    diff = float((got_logits - want_logits).abs().max())
    rtol, atol = TOLERANCE[torch.float32]
    checks = {
        "adapter_tensors": len(want),
        "unexpected_adapter_keys": len(unexpected),
        "logits_max_diff": diff,
    }
    failed = Failures()
    if not want:
        failed.append("the source adapter state dict holds no adapter tensor")
    if not_loaded:
        hint = (
            f"; the load reported {len(unexpected)} unexpected adapter keys, e.g. {unexpected[0]}" if unexpected else ""
        )
        failed.append(
            f"set_peft_model_state_dict into the {type(wrapped).__name__} loaded "
            f"{len(want) - len(not_loaded)}/{len(want)} adapter tensors: {'; '.join(not_loaded[:2])}{hint}"
        )
    if not torch.allclose(got_logits, want_logits, rtol=rtol, atol=atol):
        failed.append(f"the wrapped model's logits differ from the source model's by max |diff| {diff:.3g}")
    failed.raise_if_any()
    return checks


if __name__ == "__main__":
    main(run, CASE)
