"""An adapter loaded with low_cpu_mem_usage=True onto a CUDA model: https://github.com/huggingface/peft/issues/2129"""

from __future__ import annotations

import inspect

import torch
from peft import PeftModel, get_peft_model

from fsdp_matrix.case import (
    DTYPES,
    MODELS,
    Failures,
    RankContext,
    axis,
    build_model,
    lora_config,
    main,
    save_once,
    synthetic_batch,
)

CASE = "merge-device"


def _save_adapter(params: dict, ctx: RankContext):
    model, dtype = axis(params, "model", MODELS), axis(params, "dtype", tuple(DTYPES), default="fp32")

    def save(path):
        base = build_model(model, dtype, ctx)
        torch.manual_seed(ctx.seed)
        # init_lora_weights=False: random lora_B, so the adapter (and merging it) changes the output
        config = lora_config(task_type=None, init_lora_weights=False)
        get_peft_model(base, config).save_pretrained(str(path))

    # this node's scratch, written by its local rank 0: on several machines each node has its own
    name = "-".join(["adapter", model, dtype, f"seed{ctx.seed}"])  # no folded constant inside an f-string (export)
    return save_once(ctx, name, save, marker="adapter_config.json")


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    if ctx.device.type != "cuda":
        raise RuntimeError("merge-device needs a CUDA device: on CPU every tensor shares one device")
    if "low_cpu_mem_usage" not in inspect.signature(PeftModel.from_pretrained).parameters:
        raise TypeError("this PEFT's PeftModel.from_pretrained has no low_cpu_mem_usage (added in 0.13.0)")
    path = _save_adapter(params, ctx)
    batch = synthetic_batch(ctx)
    dtype = axis(params, "dtype", tuple(DTYPES), default="fp32")
    base = build_model(axis(params, "model", MODELS), dtype, ctx).eval()
    with torch.no_grad():
        base_logits = base(input_ids=batch).logits.float()
    # the state dict is read onto the CPU, as in the report; the model is on ctx.device
    model = PeftModel.from_pretrained(base, str(path), low_cpu_mem_usage=True, torch_device="cpu").eval()
    devices = sorted({str(p.device) for n, p in model.named_parameters() if "lora_" in n})
    with torch.no_grad():
        adapted = model(input_ids=batch).logits.float()
        merged_model = model.merge_and_unload()
        merged = merged_model(input_ids=batch).logits.float()
    checks = {
        "adapter_devices": devices,
        "adapter_effect": float((adapted - base_logits).abs().max()),
        "merge_max_diff": float((merged - adapted).abs().max()),
        "merged_devices": sorted({str(p.device) for p in merged_model.parameters()}),
    }
    failed = Failures()
    if checks["adapter_effect"] == 0.0:
        failed.append("the loaded adapter does not change the output (adapter_effect 0)")
    tolerance = 1e-3 if dtype == "fp32" else 5e-2
    if not checks["merge_max_diff"] <= tolerance * max(1.0, float(adapted.abs().max())):
        failed.append(f"merged output differs from the adapted one by {checks['merge_max_diff']}")
    if checks["merged_devices"] != [str(ctx.device)]:
        failed.append(f"merged model on {checks['merged_devices']}, not {ctx.device}")
    failed.raise_if_any()
    return checks


if __name__ == "__main__":
    main(run, CASE)
