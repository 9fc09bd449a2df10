"""trl#1723, trl#2537: TRL upcasts a QLoRA model before FSDP1 wraps it, and FSDP refuses the mixed dtypes.

A bitsandbytes 4-bit base with ``bnb_4bit_quant_storage=bfloat16`` (the FSDP-QLoRA recipe: the packed weights are
bf16, so FSDP1 can flatten them with the bf16 norms and embeddings) is handed to TRL with ``peft_config``. Where a TRL
trainer calls PEFT's ``prepare_model_for_kbit_training`` on it, every non-4-bit parameter (norms, embeddings,
``lm_head``) is upcast to fp32, and FSDP1 then raises ``Must flatten tensors with uniform dtype but got
torch.bfloat16 and torch.float32`` on the first unit that holds both. TRL PR #1416 (0.8.0) skips it in SFTTrainer for
a "sharded QLoRA" (its 4-bit weights on the CPU or meta device); DPOTrainer kept calling it.

Axes: ``trainer`` (``sft`` SFTTrainer, ``dpo`` DPOTrainer), and the shared ones (``wrap`` decoder_layer is FSDP1
through the Trainer, which puts PEFT's policy in place for a PEFT model; ``fsdp2`` shards per parameter).
"""

from __future__ import annotations

from fsdp_matrix.case import RankContext, axis, build_4bit_model, lora_config, main, trl_entry

CASE = "trl-qlora-upcast"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    model = axis(params, "model", ("llama",))
    base = build_4bit_model(model, axis(params, "dtype", ("bf16",)), axis(params, "storage", ("bf16",)), ctx)
    return trl_entry(base, lora_config(), params, ctx, trainer=axis(params, "trainer", ("sft", "dpo")))


if __name__ == "__main__":
    main(run, CASE)
