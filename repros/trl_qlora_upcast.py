"""TRL upcasts a QLoRA model before FSDP1 wraps it: https://github.com/huggingface/trl/issues/1723"""

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
