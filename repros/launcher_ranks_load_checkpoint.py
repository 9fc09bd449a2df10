"""transformers#43749 (open; PR #43785 open): under ``accelerate launch`` with ``fsdp_cpu_ram_efficient_loading``,
transformers 5's loading path reads the whole checkpoint on every rank. Only rank 0 should: ranks > 0 are meant to
hold placeholders that FSDP then fills from rank 0 (``sync_module_states``, or accelerate's
``fsdp2_load_full_state_dict``), which is the point of the option for a model that fits one copy in host memory but
not one per rank. Nothing fails: the training is right, and every rank paid a full copy.

The cell loads as a launched user does (``init: launcher``: every rank calls ``from_pretrained`` under the variables
``accelerate launch --config_file <fsdp yaml>`` exports), then compares each rank's base weights with rank 0's before
FSDP sees them: a rank > 0 that holds every one of them loaded the checkpoint itself. (Placeholders never hold the
checkpoint's random weights; a norm weight of ones may match by chance, hence "every one".) Then it trains through
``accelerator.prepare`` as any ``init: launcher`` cell does.
"""

from __future__ import annotations

import hashlib

from torch import distributed as dist

from fsdp_matrix.case import CheckFailed, RankContext, is_adapter, main, peft_model, wrap_and_train

CASE = "launcher-ranks-load-checkpoint"


def _digests(model) -> dict:
    """name -> digest of each base weight as this rank holds it ("meta" for a placeholder without storage)."""
    out = {}
    for name, param in model.get_base_model().named_parameters():
        if is_adapter(name):
            continue
        data = param.detach()
        out[name] = "meta" if data.is_meta else hashlib.sha1(data.cpu().contiguous().numpy().tobytes()).hexdigest()
    return out


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    model = peft_model(params, ctx, autocast=False)
    held = [None] * ctx.world_size
    dist.all_gather_object(held, _digests(model))
    equal = [sum(d.get(n) == h for n, h in held[0].items()) for d in held]
    total = len(held[0])
    loaded = [rank for rank in range(1, ctx.world_size) if equal[rank] == total]
    if loaded:
        raise CheckFailed(
            f"fsdp_cpu_ram_efficient_loading had no effect: rank {loaded[0]} loaded the checkpoint itself "
            f"({total}/{total} base weights equal rank 0's after from_pretrained)"
        )
    return {"base_weights_equal_rank0": equal, **wrap_and_train(model, params, ctx)}


if __name__ == "__main__":
    main(run, CASE)
