"""DoRA initialised on a 4-bit base on the CPU: https://github.com/huggingface/peft/issues/1674"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from fsdp_matrix.case import (
    MODELS,
    WRAPS,
    CheckFailed,
    RankContext,
    add_adapter,
    axis,
    build_model,
    flag,
    main,
    train_and_check,
    wrap,
)

CASE = "qdora-cpu-init"

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The decoder Linears that become 4-bit, as a bitsandbytes QLoRA load makes them (lm_head stays full)."""
STORAGE = {"uint8": torch.uint8, "fp32": torch.float32, "bf16": torch.bfloat16}


def quantize_linears(model: nn.Module, storage: str, device: torch.device) -> int:
    """Swap every decoder Linear for an nf4 ``Linear4bit`` holding the same weight, quantized on ``device``.

    bitsandbytes quantizes a ``Params4bit`` when it is first moved to a device; on the CPU that needs its CPU
    backend (bitsandbytes >= 0.47). Returns the number of layers swapped.
    """
    import bitsandbytes as bnb

    quant_storage = STORAGE[storage]
    takes_module = "module" in inspect.signature(bnb.nn.Params4bit.__new__).parameters
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not (isinstance(child, nn.Linear) and name in LINEARS):
                continue
            layer = bnb.nn.Linear4bit(
                child.in_features,
                child.out_features,
                bias=child.bias is not None,
                compute_dtype=child.weight.dtype,
                quant_type="nf4",
                quant_storage=quant_storage,
            )
            extra = {"module": layer} if takes_module else {}
            layer.weight = bnb.nn.Params4bit(
                child.weight.data.clone(), requires_grad=False, quant_type="nf4", quant_storage=quant_storage, **extra
            )
            if child.bias is not None:
                layer.bias = nn.Parameter(child.bias.data.clone(), requires_grad=False)
            setattr(parent, name, layer.to(device))
            swapped += 1
    return swapped


def _dequantized(layer: nn.Module) -> torch.Tensor:
    import bitsandbytes.functional as bnbf

    weight = layer.weight
    return bnbf.dequantize_4bit(weight.data, weight.quant_state).float()


def check_magnitudes(model: nn.Module) -> dict:
    """Each DoRA magnitude must be the row norm of its dequantized base weight (``lora_B`` starts at zero, so
    the LoRA term adds nothing at init). CheckFailed names each layer whose magnitude is off, with both norms."""
    checked, wrong = 0, []
    for name, module in model.named_modules():
        store = getattr(module, "lora_magnitude_vector", None)
        if not store or "default" not in store:
            continue
        magnitude = store["default"]
        magnitude = getattr(magnitude, "weight", magnitude).detach().float().cpu()  # DoraLinearLayer from 0.12
        expected = torch.linalg.norm(_dequantized(module.get_base_layer()).cpu(), dim=1)
        checked += 1
        if magnitude.shape != expected.shape or not torch.allclose(magnitude, expected, rtol=1e-4, atol=1e-6):
            diff = float((magnitude - expected).abs().max()) if magnitude.shape == expected.shape else float("nan")
            wrong.append(
                f"{name}.lora_magnitude_vector: shape {list(magnitude.shape)}, max |diff| {diff:.3g} to the row norm "
                f"of the dequantized base weight (shape {list(expected.shape)})"
            )
    if checked == 0:
        raise CheckFailed("no DoRA magnitude vector in the model: DoRA was not applied")
    if wrong:
        raise CheckFailed(f"{len(wrong)}/{checked} DoRA magnitudes wrong after init on the CPU: {'; '.join(wrong[:3])}")
    return {"dora_magnitudes_checked": checked}


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    axis(params, "adapter", ("qdora",), default="qdora")
    where = axis(params, "quantized_on", ("cpu", "cuda"), default="cpu")
    if where == "cuda" and ctx.device.type != "cuda":
        raise RuntimeError("quantized_on=cuda needs a CUDA device")
    model = build_model(axis(params, "model", MODELS, default="llama"), "fp32", ctx).to("cpu")
    swapped = quantize_linears(model, axis(params, "storage", tuple(STORAGE), default="uint8"), torch.device(where))
    if where != "cpu":
        model = model.to("cpu")  # quantized on the GPU, then parked on the CPU as the report's loading leaves it
    first = model.get_submodule("model.layers.0.self_attn.q_proj").weight
    built = {
        "linear4bit": swapped,
        "base_weight": f"{type(first).__name__} {first.dtype} on {first.device}",
        "cuda_available": torch.cuda.is_available(),
    }
    # the step of the report: DoRA's init dequantizes every 4-bit base weight that sits on the CPU
    peft_model = add_adapter(model, "dora", ctx.seed)
    built.update(check_magnitudes(peft_model))
    peft_model = peft_model.to(ctx.device)
    wrapped = wrap(peft_model, axis(params, "wrap", WRAPS, default="fsdp2"), flag(params, "orig", default=None), ctx)
    return {**built, **train_and_check(wrapped, ctx)}


if __name__ == "__main__":
    main(run, CASE)
