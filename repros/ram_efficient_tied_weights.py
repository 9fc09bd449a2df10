"""accelerate PR #3154 (v1.1.0): under ``accelerate launch`` with ``fsdp_cpu_ram_efficient_loading``, FSDP1's
``param_init_fn`` (``to_empty(recurse=False)``, one module at a time) gives a tied embedding and head two separate
tensors on ranks > 0, while rank 0 keeps one: the ranks build different flat parameters.

The cell loads as a launched user does (``init: launcher``): every rank calls ``from_pretrained`` under the variables
``accelerate launch --config_file <fsdp yaml>`` exports, so transformers' own FSDP path (``is_fsdp_enabled()``)
decides what ranks > 0 hold; a Gemma (``tie_word_embeddings``) gets LoRA and goes through ``accelerator.prepare``.
From accelerate 1.1.0 ``prepare`` wraps the plugin's ``param_init_fn`` in ``ensure_weights_retied``. ``model: llama``
(untied) is the control.

Where ranks > 0 held a meta tied pair, their module states would differ in size from rank 0's when FSDP broadcasts
them (``sync_module_states``), and gloo aborts the process; so the cell compares the sizes across ranks first and
fails with them, on every rank at once. The forward check compares the wrapped model with the checkpoint.
"""

from __future__ import annotations

from unittest import mock

from torch import distributed as dist
from torch.distributed.fsdp import _init_utils

from fsdp_matrix.case import CheckFailed, RankContext, main, peft_model, wrap_and_train

CASE = "ram-efficient-tied-weights"


def _compared(original):
    def sync(group, states, *args, **kwargs):
        sizes = [None] * dist.get_world_size(group)
        dist.all_gather_object(sizes, [t.numel() for t in states], group=group)
        if any(s != sizes[0] for s in sizes):
            held = ", ".join(f"rank {r}: {len(s)} tensors / {sum(s)} elements" for r, s in enumerate(sizes))
            raise CheckFailed(f"sync_module_states: the ranks hold different module states ({held})")
        return original(group, states, *args, **kwargs)

    return sync


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    model = peft_model(params, ctx, autocast=False)
    base = model.get_base_model()
    tied = base.get_output_embeddings().weight is base.get_input_embeddings().weight
    with mock.patch.object(_init_utils, "_sync_params_and_buffers", _compared(_init_utils._sync_params_and_buffers)):
        checks = wrap_and_train(model, params, ctx)
    return {"tied_after_load": tied, **checks}


if __name__ == "__main__":
    main(run, CASE)
