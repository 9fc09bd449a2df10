"""trl#6470 (trl PR #6499 closed, PR #6527 open): DPOTrainer with ``precompute_ref_log_probs=True`` and no
``ref_model``, under FSDP2 with a PEFT adapter. The reference log-probs are computed with the policy itself (its
adapter disabled) before ``accelerator.prepare`` has moved and sharded it: the model is still on the CPU while the
batches are on the GPU, ``RuntimeError: Expected all tensors to be on the same device``.

On CPU every tensor is on the CPU, so the cells need CUDA. ``precompute: 0`` is the control.
"""

from __future__ import annotations

from fsdp_matrix.case import RankContext, base_model, flag, lora_config, main, trl_entry

CASE = "trl-dpo-precompute-fsdp2"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    precompute = bool(flag(params, "precompute"))
    model = base_model(params, ctx).cpu()  # loaded as users load it: prepare moves it
    return trl_entry(model, lora_config(), params, ctx, trainer="dpo", precompute_ref_log_probs=precompute)


if __name__ == "__main__":
    main(run, CASE)
