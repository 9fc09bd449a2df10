"""accelerate PR #3762 (1.11.0): under FSDP2, ``accelerator.no_sync()`` / ``accumulate()`` did nothing.

An FSDP2 module has no ``no_sync``; accelerate before 1.11.0 fell back to ``contextlib.nullcontext``, so every
micro-step of gradient accumulation reduce-scattered its gradients: the same values, more traffic and memory, no
error. 1.11.0 calls ``set_requires_gradient_sync(False)`` instead. The Trainer's own accumulation loop goes through
the same ``accelerator.no_sync``.

The cell: LoRA on the tiny Llama, FSDP2 through ``Accelerator.prepare`` (``accumulate(model)`` around each
micro-step) or the Trainer (``gradient_accumulation_steps``), ``accum`` 1 or 2. The collectives check
(workload/collectives.py) counts each unit's reduce-scatters per optimizer step: more than one is the bug.
"""

from __future__ import annotations

from fsdp_matrix.case import RankContext, main, peft_model, wrap_and_train

CASE = "accelerate-fsdp2-no-sync"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    return wrap_and_train(peft_model(params, ctx), params, ctx)


if __name__ == "__main__":
    main(run, CASE)
