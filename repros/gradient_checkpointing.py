"""LoRA/DoRA under FSDP with activation checkpointing: https://github.com/huggingface/peft/issues/1910"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

from fsdp_matrix.case import (
    WRAPS,
    Failures,
    RankContext,
    add_adapter,
    axis,
    base_model,
    count_attention_calls,
    decoder_layer_class,
    decoder_layers,
    flag,
    main,
    synthetic_batch,
    train_and_check,
    trainable_names,
    wrap,
)

CASE = "gradient-checkpointing"
GC = ("none", "hf_reentrant", "hf_nonreentrant", "torch_ac")
STEPS = 3
TOLERANCE = 1e-5


def _torch_ac(model: nn.Module) -> None:
    cls = decoder_layer_class(model)
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda module: isinstance(module, cls),
    )


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    gc, kind = axis(params, "gc", GC), axis(params, "wrap", WRAPS)
    batch = synthetic_batch(ctx)
    base = base_model(params, ctx)
    with torch.no_grad():
        # LoRA's lora_B and DoRA's magnitude start where the adapted model's output equals the base model's
        reference_loss = float(base(input_ids=batch, labels=batch).loss)
    base.config.use_cache = flag(params, "cache")
    if gc.startswith("hf_"):
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": gc == "hf_reentrant"})
        base.enable_input_require_grads()
    model = add_adapter(base, axis(params, "adapter", ("lora", "dora")), ctx.seed)
    layers = len(decoder_layers(model))
    calls = count_attention_calls(model)
    trainable = trainable_names(model)
    if gc == "torch_ac" and kind == "fsdp2":
        _torch_ac(model)
    wrapped = wrap(model, kind, flag(params, "orig", default=None), ctx)
    if gc == "torch_ac" and kind != "fsdp2":
        _torch_ac(wrapped)
    checks = train_and_check(wrapped, ctx, steps=STEPS, trainable=trainable)
    runs = calls.total / (STEPS * layers)
    checks.update({"attention_runs_per_layer_step": runs, "reference_loss": reference_loss})
    failed = Failures()
    want = 1 if gc == "none" else 2
    if runs != want:
        failed.append(f"attention ran {runs} times per layer and step, expected {want} (checkpointing {gc})")
    if abs(checks["losses"][0] - reference_loss) > TOLERANCE:
        failed.append(f"first loss {checks['losses'][0]} differs from the plain model's {reference_loss}")
    failed.raise_if_any()
    return checks


if __name__ == "__main__":
    main(run, CASE)
