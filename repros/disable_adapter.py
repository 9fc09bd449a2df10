"""disable_adapter() under FSDP1 with the LoRA unit unsharded: https://github.com/huggingface/peft/issues/2977"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from fsdp_matrix.case import (
    WRAPS,
    Failures,
    RankContext,
    TrainingChecks,
    add_adapter,
    axis,
    base_model,
    decoder_layer_policy,
    flag,
    fsdp1,
    fsdp2,
    main,
    synthetic_batch,
    trainable_names,
)

CASE = "disable-adapter"
STEPS = 3
TOLERANCE = 1e-5
"""Largest |disabled logits - base logits| that counts as equal (fp32; observed 0.0 where it worked)."""


def _disabled(peft_model: nn.Module, api: str):
    if api == "ctx":
        return peft_model.disable_adapter()

    @contextlib.contextmanager
    def layers():
        peft_model.disable_adapter_layers()
        try:
            yield
        finally:
            peft_model.enable_adapter_layers()

    return layers()


class TwoPass(nn.Module):
    """One forward with the adapter, then one with it disabled, inside this module's forward (what FSDP wraps)."""

    def __init__(self, peft_model: nn.Module, api: str) -> None:
        super().__init__()
        self.peft_model = peft_model
        self.api = api
        self.enabled_logits = None
        self.disabled_logits = None

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor = None) -> CausalLMOutputWithPast:
        out = self.peft_model(input_ids=input_ids, labels=labels)
        with _disabled(self.peft_model, self.api):
            ref = self.peft_model(input_ids=input_ids, labels=labels)
        self.enabled_logits, self.disabled_logits = out.logits.detach(), ref.logits.detach()
        loss = None if labels is None else out.loss + ref.loss
        # a ModelOutput (a dict), so FSDP1 finds the tensors to hook its post-backward on
        return CausalLMOutputWithPast(loss=loss, logits=out.logits)


def _wrap(module: nn.Module, peft_model: nn.Module, params: dict, ctx: RankContext) -> nn.Module:
    wrap, orig = axis(params, "wrap", ("root", *WRAPS)), flag(params, "orig", default=True)
    if wrap == "fsdp2":
        return fsdp2(module, ctx)
    if wrap == "root":
        return fsdp1(module, None, orig, ctx)
    if wrap == "decoder_layer":
        return fsdp1(module, decoder_layer_policy(module), orig, ctx)
    if wrap == "peft_policy":
        from peft.utils.other import fsdp_auto_wrap_policy

        # the policy is read off the PEFT model: an outer module has no _no_split_modules
        return fsdp1(module, fsdp_auto_wrap_policy(peft_model), orig, ctx)
    raise ValueError(f"unknown wrap {wrap!r} (expected root, decoder_layer, peft_policy or fsdp2)")


def _maxdiff(logits: torch.Tensor, base: torch.Tensor) -> float:
    return float((logits.float() - base).abs().max())


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    call, api = axis(params, "call", ("in_forward", "after_forward", "idle")), axis(params, "api", ("ctx", "layers"))
    batch = synthetic_batch(ctx)
    base = base_model(params, ctx)
    with torch.no_grad():
        base_logits = base(input_ids=batch).logits.float()
    peft_model = add_adapter(base, axis(params, "adapter", ("lora", "dora")), ctx.seed)
    outer = TwoPass(peft_model, api) if call == "in_forward" else peft_model
    trainable = trainable_names(outer)
    model = _wrap(outer, peft_model, params, ctx)

    judge = TrainingChecks(trainable, ctx.device, ctx.world_size)
    judge.snapshot(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    disabled_diffs = []
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        if call == "idle":
            with torch.no_grad(), _disabled(peft_model, api):
                disabled_diffs.append(_maxdiff(model(input_ids=batch).logits, base_logits))
        out = model(input_ids=batch, labels=batch)
        if call == "in_forward":
            disabled_diffs.append(_maxdiff(outer.disabled_logits, base_logits))
        if call == "after_forward":
            with torch.no_grad(), _disabled(peft_model, api):
                disabled_diffs.append(_maxdiff(model(input_ids=batch).logits, base_logits))
        out.loss.backward()
        judge.record_grads(model)
        optimizer.step()
        judge.record_loss(float(out.loss.detach()))
    with torch.no_grad():
        out = model(input_ids=batch)
        enabled_diff = _maxdiff(outer.enabled_logits if call == "in_forward" else out.logits, base_logits)
    del optimizer
    checks = judge.finish(model, {"disabled_vs_base": disabled_diffs, "enabled_vs_base": enabled_diff})
    failed = Failures()
    if not all(d <= TOLERANCE for d in disabled_diffs):
        failed.append(f"with the adapter disabled the logits differ from the base model's by {disabled_diffs}")
    if not enabled_diff > TOLERANCE:
        failed.append(f"the trained adapter does not change the logits (max diff {enabled_diff})")
    failed.raise_if_any()
    return checks


if __name__ == "__main__":
    main(run, CASE)
