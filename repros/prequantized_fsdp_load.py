"""transformers PR #41415 (and PR #42600; bitsandbytes PR #1295): a pre-quantized bitsandbytes 4-bit checkpoint
loaded by a launched FSDP user (``accelerate launch`` with ``fsdp_cpu_ram_efficient_loading``): transformers' own
FSDP path (``is_fsdp_enabled()``) loads rank 0's weights and leaves placeholders on ranks > 0, and its loading
refactors broke that path for pre-quantized 4-bit weights.

Every rank quantizes the tiny model once, rank 0 saves it (``save_pretrained`` of the 4-bit model, ``storage``
the ``bnb_4bit_quant_storage``), then every rank calls ``from_pretrained`` on that checkpoint under the variables
``accelerate launch --config_file <fsdp yaml>`` exports (``accelerate_launch_env``). Rank 0 must hold the packed
weights and quantization state it saved, bit for bit; every rank must hold each 4-bit weight in the saved shape and
storage dtype, which FSDP's ``sync_module_states`` needs to fill ranks > 0.
"""

from __future__ import annotations

import contextlib

import torch

from fsdp_matrix.case import (
    CheckFailed,
    RankContext,
    accelerate_launch_env,
    axis,
    build_4bit_model,
    decoder_layer_class,
    fsdp_launch_config,
    main,
    save_once,
)

CASE = "prequantized-fsdp-load"


def _packed(model: torch.nn.Module) -> dict:
    return {n: p for n, p in model.named_parameters() if type(p).__name__ == "Params4bit"}


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8)


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    storage = axis(params, "storage", ("uint8", "bf16"))
    quantized = build_4bit_model("llama", "bf16", storage, ctx)
    saved = {n: p.detach().cpu().clone() for n, p in _packed(quantized).items()}
    path = save_once(ctx, f"{CASE}-{storage}-seed{ctx.seed}", quantized.save_pretrained)
    layer = decoder_layer_class(quantized).__name__
    config = fsdp_launch_config(layer, 1, True, ctx.world_size)
    launched = axis(params, "init", ("launcher", "full")) == "launcher"  # full: the same load, not launched
    with accelerate_launch_env(config) if launched else contextlib.nullcontext({}) as exported:
        loaded = type(quantized).from_pretrained(path, torch_dtype=torch.bfloat16)
    got = {n: p for n, p in loaded.named_parameters() if n in saved}
    wrong = [n for n, t in saved.items() if n not in got or got[n].shape != t.shape or got[n].dtype != t.dtype]
    if wrong:
        held = {n: (tuple(got[n].shape), str(got[n].dtype)) if n in got else None for n in wrong[:2]}
        raise CheckFailed(f"rank {ctx.rank} holds {len(wrong)}/{len(saved)} 4-bit weights not as saved: {held}")
    meta = sum(p.device.type == "meta" for p in got.values())
    if ctx.is_main:
        # bytes, not values: bf16-stored packed words include NaN patterns, which never compare equal as floats
        differ = [n for n, t in saved.items() if meta or not torch.equal(_bytes(got[n]), _bytes(t))]
        if differ:
            raise CheckFailed(f"rank 0 loaded {len(differ)}/{len(saved)} packed 4-bit weights other than it saved")
    linear4bit = sum(type(m).__name__ == "Linear4bit" for m in loaded.modules())
    return {"launch_env": sorted(exported), "linear4bit": linear4bit, "weights_4bit": len(saved), "on_meta": meta}


if __name__ == "__main__":
    main(run, CASE)
