"""peft#1577, transformers#33930, transformers#42489: reentrant gradient checkpointing on a PEFT model whose inputs
are frozen: ``RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn``.

With LoRA only inside the decoder layers, the hidden states that enter each checkpointed layer come from a frozen
embedding and do not require grad. torch's reentrant checkpoint then builds no graph through the layer ("None of
the inputs have requires_grad=True. Gradients will be None"), the loss has no ``grad_fn``, and ``backward`` raises.
``get_peft_model`` hooks the embedding output itself (``enable_input_require_grads``) only when checkpointing is
already on when it runs; checkpointing turned on afterwards (by the user, or by the Trainer's
``gradient_checkpointing=True``) is the report. Workarounds: ``model.enable_input_require_grads()``, or
``gradient_checkpointing_kwargs={"use_reentrant": False}``.

Unlike ``gradient-checkpointing`` (peft#1910, which always hooks the inputs), this case varies the hook:

- ``gc``: ``hf_reentrant`` / ``hf_nonreentrant``: transformers' checkpointing with ``use_reentrant`` True / False;
- ``inputs``: ``peft``: checkpointing turned on before ``get_peft_model`` (PEFT hooks the inputs); ``manual``:
  turned on after it, then ``enable_input_require_grads()`` (the workaround); ``none``: turned on after it, nothing
  else (the report). Through the Trainer, the Trainer turns checkpointing on itself (``gradient_checkpointing=True``
  in ``TrainingArguments``), after PEFT, so ``inputs`` is ``none`` or ``manual`` there.

A fix holds when training passes every check and the attention of every decoder layer was recomputed once per step
in backward (checkpointing was really on).
"""

from __future__ import annotations

import torch
from torch import nn

from fsdp_matrix.case import (
    CheckFailed,
    RankContext,
    add_adapter,
    axis,
    base_model,
    decoder_layers,
    main,
    train_and_check,
    trainable_names,
    trainer_setup,
    trainer_train_and_check,
    wrap_cell,
)

CASE = "gc-frozen-inputs"
GC = {"hf_reentrant": True, "hf_nonreentrant": False}
INPUTS = ("peft", "manual", "none")
STEPS = 3


def _count_attention(model: nn.Module) -> list:
    # a hook on the attention module: transformers 5 checkpoints the layer's forward, not its __call__, so hooks on
    # the layer itself do not see the recompute
    # [forward calls, calls inside a backward pass]: only the latter are checkpointing's recompute, whatever other
    # forwards (the harness's forward check, say) the model runs
    calls = [0, 0]

    def hook(*_):
        calls[1 if torch._C._current_graph_task_id() != -1 else 0] += 1

    for layer in decoder_layers(model):
        for name, module in layer.named_children():
            if name == "self_attn":
                module.register_forward_pre_hook(hook)
    return calls


def _kwargs(gc: str) -> dict:
    return {"gradient_checkpointing_kwargs": {"use_reentrant": GC[gc]}}


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    gc, inputs = axis(params, "gc", tuple(GC)), axis(params, "inputs", tuple(INPUTS))
    entry = axis(params, "entry", ("torch", "trainer"), default="torch")
    if entry not in ("torch", "trainer"):
        raise ValueError(f"{CASE} runs through the torch or trainer entry, not {entry!r}")
    if entry == "trainer" and inputs == "peft":
        raise ValueError("through the Trainer, checkpointing is turned on by the Trainer, after PEFT: inputs peft")
    base = base_model(params, ctx)
    if inputs == "peft":
        base.gradient_checkpointing_enable(**_kwargs(gc))
    model = add_adapter(base, axis(params, "adapter", ("lora",)), ctx.seed)
    if inputs != "peft" and entry == "torch":
        model.gradient_checkpointing_enable(**_kwargs(gc))
    if inputs == "manual":
        model.enable_input_require_grads()
    layers = len(decoder_layers(model))
    calls = _count_attention(model)
    trainable = trainable_names(model)
    if entry == "trainer":
        with trainer_setup(model, params, ctx, gradient_checkpointing=True, **_kwargs(gc)) as trainer:
            checks = trainer_train_and_check(trainer, params, ctx, trainable)
    else:
        wrapped = wrap_cell(model, params, ctx)
        checks = train_and_check(wrapped, ctx, steps=STEPS, trainable=trainable)
    recomputed = calls[1] / (STEPS * layers)
    checks["attention_recomputed_per_layer_step"] = recomputed
    if recomputed != 1:
        raise CheckFailed(
            f"attention was recomputed in backward {recomputed} times per layer and step, expected 1 "
            f"(checkpointing {gc} was off)"
        )
    return checks


if __name__ == "__main__":
    main(run, CASE)
