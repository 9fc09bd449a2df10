"""What a case needs beyond the settings a config holds: a call the training script makes (``generate()``, a merge, a
save by hand), or a PEFT setting no axis carries. A config alone cannot say whether a script does it, so such a case
is answered as "may apply", with the action named; it never sets the exit status.

Read from each case's title and report (matrix.yaml); a case not named here is reached by training with its settings
alone. A new case that needs an action is added here (tests/check/test_needs.py keeps every name a case of
matrix.yaml).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional

NEEDS: Dict[str, str] = {
    "merge-device": "loads an adapter with low_cpu_mem_usage=True onto a CUDA model",
    "checkpoint-roundtrip": "saves the adapter by one of the paths the case names and loads it back",
    "adapter-save-sharded": "calls save_pretrained on the PEFT model inside FSDP without gathering",
    "adapter-load-wrapped": "loads adapter weights into the FSDP-wrapped model (set_peft_model_state_dict)",
    "merge-under-fsdp": "calls merge_and_unload on the PEFT model inside FSDP",
    "disable-adapter": "disables the adapter under FSDP1 (disable_adapter(), e.g. a reference pass)",
    "generate-fsdp2": "calls generate() on the fully_shard-ed model",
    "generate-fsdp1": "calls generate() on the FSDP1-wrapped model",
    "prompt-tuning-sharded-load": "loads a SHARDED_STATE_DICT checkpoint of a prompt-tuning model",
    "peft-meta-base-load": "applies PEFT on meta before fully_shard, then loads the base checkpoint",
    "qlora-full-state-dict": "calls get_model_state_dict(full_state_dict=True, cpu_offload=True)",
    "lora-after-shard": "adds LoRA (get_peft_model) after the model is sharded",
    "second-adapter-meta": "adds or loads a second adapter",
    "resize-embeddings-meta": "resizes the token embeddings with mean resizing",
    "save-rank0-state-dict": "saves the adapter on rank 0 only",
    "ref-model-eval-prepare": "prepares a frozen reference model with prepare_model(evaluation_mode=True)",
    "trl-dpo-precompute-fsdp2": "runs DPOTrainer with precompute_ref_log_probs and no ref_model",
    "prequantized-fsdp-load": "loads a pre-quantized 4-bit checkpoint",
    "fsdp2-lora-embedding": "targets embed_tokens with LoRA and shards each LoRA submodule on its own",
    "no-split-modules": "builds PEFT's fsdp_auto_wrap_policy for a model without _no_split_modules",
    "accelerate-compile-adapter-checkpoint": "saves the compiled model's FSDP checkpoint adapter-only",
    "ram-efficient-tied-weights": "trains a model with tied input and output embeddings",
    "uneven-shards": "has a LoRA rank or hidden size that the shard group does not divide",
    "qdora-cpu-init": "initialises QDoRA on a 4-bit base still on the CPU",
    "fsdp1-frozen-mixed-unit": "wraps frozen and trainable parameters in one FSDP1 unit",
}
"""Case id -> what the user's script must do for the case to apply (its title, in the user's words)."""

FACTS: Dict[str, Callable[[Mapping[str, Any]], Optional[bool]]] = {
    "modules-to-save": lambda f: None if "modules_to_save" not in f else bool(f["modules_to_save"]),
    "trainable-tokens": lambda f: None if "trainable_token_indices" not in f else bool(f["trainable_token_indices"]),
}
"""Case id -> whether the PEFT config has what the case trains (True / False), None when no adapter config says."""
FACT_WORDS = {
    "modules-to-save": "sets modules_to_save",
    "trainable-tokens": "sets trainable_token_indices",
}


def needs(case_id: str, facts: Mapping[str, Any]) -> Optional[str]:
    """The action the case needs that the files do not show, '' when the files show it, None when they rule the
    case out."""
    if case_id in FACTS:
        has = FACTS[case_id](facts)
        return None if has is False else ("" if has else FACT_WORDS[case_id] + " in its adapter config")
    return NEEDS.get(case_id, "")
