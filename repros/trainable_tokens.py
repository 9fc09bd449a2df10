"""LoRA with trainable tokens (``LoraConfig(trainable_token_indices=...)``) under FSDP: train, then take the adapter
state dict the way accelerate and the Trainer save it (``get_peft_model_state_dict`` on the wrapped model).

Before PEFT 0.17.0 (PR #2681) the trainable-tokens wrapper looked up its keys in the state dict with the module
name FSDP1 gives it (``_fsdp_wrapped_module.`` prefix), while FSDP's full state dict keys have no prefix. Trainable
tokens exist from PEFT 0.15.0. The token ids are taken from the training batch: a token that never occurs gets no
gradient, and the checks would rightly fail it.
"""

from __future__ import annotations

import torch
from peft import get_peft_model, get_peft_model_state_dict
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import lora_config
from fsdp_matrix.workload.checks import clean_name, full_parameters, trainable_names, wrapper_kind
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.models import DTYPES, build_model
from fsdp_matrix.workload.params import axis, flag
from fsdp_matrix.workload.recipe import MODELS
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import WRAPS, wrap

CASE = "trainable-tokens"


def adapter_state_dict(model: torch.nn.Module) -> dict:
    """``get_peft_model_state_dict`` of a wrapped model over its full state dict, as accelerate's FSDP save does."""
    if wrapper_kind(model) == "fsdp1":
        # offload_to_cpu=False: on CPU the offload path frees storage the state dict still uses
        config = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
        with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
            state = get_peft_model_state_dict(model)
    else:
        state = get_peft_model_state_dict(model)
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    tokens = sorted({int(t) for t in synthetic_batch(ctx)[0, :3]})
    config = lora_config(trainable_token_indices=tokens)
    torch.manual_seed(ctx.seed)  # the same adapter on every rank
    model = get_peft_model(
        build_model(axis(params, "model", MODELS), axis(params, "dtype", tuple(DTYPES), default="fp32"), ctx), config
    )
    trainable = trainable_names(model)
    wrapped = wrap(model, axis(params, "wrap", WRAPS), flag(params, "orig", default=None), ctx)
    checks = train_and_check(wrapped, ctx, trainable=trainable)
    saved = adapter_state_dict(wrapped)
    trained = {clean_name(n): t for n, t in full_parameters(wrapped, wrapper_kind(wrapped)).items()}
    # PEFT's saved keys drop the adapter name: ...lora_A.default.weight -> ...lora_A.weight
    missing = [n for n in trainable if n.replace(".default", "") not in saved]
    differ = [
        n
        for n in trainable
        if n not in missing
        and not torch.equal(saved[n.replace(".default", "")].detach().cpu().reshape(-1).view(torch.uint8), trained[n])
    ]
    checks.update(tokens=tokens, saved_tensors=len(saved), saved_missing=missing, saved_differ=differ)
    if missing or differ:
        raise CheckFailed(
            f"adapter state dict: {len(missing)}/{len(trainable)} trainable tensors missing {missing[:3]}, "
            f"{len(differ)} differ from the trained ones {differ[:3]}"
        )
    return checks


if __name__ == "__main__":
    from fsdp_matrix.standalone import main

    main(run, CASE)
