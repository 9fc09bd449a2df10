"""transformers#34702: PEFT's FSDP SFT example (TRL's SFTTrainer) fails at the first optimizer step with ``expected
dtype float for `end` but got dtype c10::BFloat16``.

The example's recipe: a bf16 base (4-bit with bf16 quant storage for QLoRA), ``mixed_precision: bf16``, FSDP1 with
``use_orig_params: false``. Under FSDP mixed precision accelerate upcasts every trainable low-precision FlatParameter
to fp32 when it wraps (``Upcasted low precision parameters ... because mixed precision turned on in FSDP``); with
``use_orig_params=False`` the gradient still reaches the optimizer as bf16, and AdamW's ``exp_avg.lerp_(grad, ...)``
(torch's single-tensor AdamW, the Trainer's ``adamw_torch``, as in the report) refuses to mix them. Adapters that PEFT
already upcast to fp32 (``autocast_adapter_dtype``, PEFT >= 0.12) are not upcast again, so whether it happens depends
on the adapter's dtype when FSDP wraps it.
"""

from __future__ import annotations

from fsdp_matrix.case import RankContext, axis, build_4bit_model, build_model, lora_config, main, trl_entry

CASE = "fsdp1-mp-optimizer-dtype"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    model, dtype = axis(params, "model", ("llama",)), axis(params, "dtype", ("bf16",))
    if axis(params, "adapter", ("lora", "qlora")) == "qlora":
        base = build_4bit_model(model, dtype, axis(params, "storage", ("bf16",)), ctx)
    else:
        base = build_model(model, dtype, ctx)
    # the report's optimizer: transformers' default before adamw_torch_fused became it
    return trl_entry(base, lora_config(), params, ctx, optim="adamw_torch")


if __name__ == "__main__":
    main(run, CASE)
