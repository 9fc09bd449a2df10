"""Checkpoint round trips: save the trained adapter under FSDP by a path users use, reload it
into a fresh unwrapped model, check it.

Axes: ``save`` (the path, below), ``sdt`` (``full``/``sharded`` state dict type, for the resume paths),
``wrap``/``orig`` (how the model is sharded), ``model``, ``dtype``. Paths: ``fsdp1_full`` (FSDP1 FULL_STATE_DICT +
get_peft_model_state_dict), ``fsdp2_full`` (get_model_state_dict with full_state_dict=True), ``sharded_dcp``
(torch.distributed.checkpoint), ``unwrapped_save_pretrained`` (PeftModel.save_pretrained on the unwrapped module),
``acc_get_state_dict``, ``acc_save_model``, ``acc_save_state`` (+ load_state), ``trainer_save_model`` and
``trainer_resume`` (resume_from_checkpoint). After 3 training steps (with the usual training checks) the cell fails
with CheckFailed when a saved adapter tensor is missing, not full-shape, or not the trained value, when the
reloaded model does not hold it or its logits differ from the FSDP model's beyond the dtype's tolerance, or when a
resumed run does not continue the saved one (see fsdp_matrix/workload/checkpoint.py).
"""

from __future__ import annotations

from fsdp_matrix.case import (
    DTYPES,
    HF_SAVES,
    RAW_PATHS,
    RankContext,
    adapter_dtypes,
    axis,
    base_dtype_name,
    base_model,
    cell_dir,
    full_shapes,
    has_autocast_option,
    hf_roundtrip,
    main,
    peft_model,
    raw_roundtrip,
    torch_dtype,
    train_and_check,
    wrap_cell,
)

CASE = "checkpoint-roundtrip"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    save, dtype = axis(params, "save", (*HF_SAVES, *RAW_PATHS)), axis(params, "dtype", tuple(DTYPES), default="fp32")
    if save not in RAW_PATHS and save not in HF_SAVES:
        raise ValueError(f"unknown save path {save!r}")
    # half-precision cells keep the adapter in the base dtype, so FSDP1 units stay uniform (peft#2129 is another case)
    autocast = False if dtype != "fp32" and has_autocast_option() else None

    def build_peft():
        return peft_model(params, ctx, autocast=autocast)

    model = build_peft()
    if adapter_dtypes(model) != [base_dtype_name(params)]:
        raise RuntimeError(f"adapters are {adapter_dtypes(model)}, not {base_dtype_name(params)}")
    expected = full_shapes(model)
    builders = (lambda: base_model(params, ctx), build_peft)
    with cell_dir(ctx, params) as out:
        if save in HF_SAVES:
            del model  # accelerate and the Trainer wrap and train a model of their own
            return {"save": save, **hf_roundtrip(save, params, ctx, out, builders, expected, torch_dtype(dtype))}
        wrapped = wrap_cell(model, params, ctx)
        checks = train_and_check(wrapped, ctx)
        return {
            "save": save,
            **checks,
            **raw_roundtrip(save, wrapped, ctx, out, builders, expected, torch_dtype(dtype)),
        }


if __name__ == "__main__":
    main(run, CASE)
