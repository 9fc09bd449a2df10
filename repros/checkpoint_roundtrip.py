"""Checkpoint round trips (issue 11, part 3): save the trained adapter under FSDP by a path users use, reload it
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

from fsdp_matrix.workload.adapters import adapter_dtypes, has_autocast_option
from fsdp_matrix.workload.checkpoint import cell_dir, full_shapes
from fsdp_matrix.workload.checkpoint_hf import HF_SAVES, hf_roundtrip
from fsdp_matrix.workload.checkpoint_torch import RAW_PATHS, raw_roundtrip
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.models import DTYPES, build_model, torch_dtype
from fsdp_matrix.workload.params import axis, flag
from fsdp_matrix.workload.recipe import MODELS, base_dtype_name, peft_model
from fsdp_matrix.workload.training import train_and_check
from fsdp_matrix.workload.wrapping import WRAPS, wrap

CASE = "checkpoint-roundtrip"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    save, dtype = axis(params, "save", (*HF_SAVES, *RAW_PATHS)), axis(params, "dtype", tuple(DTYPES), default="fp32")
    if save not in RAW_PATHS and save not in HF_SAVES:
        raise ValueError(f"unknown save path {save!r}")
    # half-precision cells keep the adapter in the base dtype, so FSDP1 units stay uniform (report 3 is elsewhere)
    autocast = False if dtype != "fp32" and has_autocast_option() else None

    def build_peft():
        return peft_model(params, ctx, autocast=autocast)

    def build_base():
        return build_model(axis(params, "model", MODELS), dtype, ctx)

    model = build_peft()
    if adapter_dtypes(model) != [base_dtype_name(params)]:
        raise RuntimeError(f"adapters are {adapter_dtypes(model)}, not {base_dtype_name(params)}")
    expected = full_shapes(model)
    builders = (build_base, build_peft)
    with cell_dir(ctx, params) as out:
        if save in HF_SAVES:
            del model  # accelerate and the Trainer wrap and train a model of their own
            return {"save": save, **hf_roundtrip(save, params, ctx, out, builders, expected, torch_dtype(dtype))}
        wrapped = wrap(model, axis(params, "wrap", WRAPS), flag(params, "orig", default=None), ctx)
        checks = train_and_check(wrapped, ctx)
        return {
            "save": save,
            **checks,
            **raw_roundtrip(save, wrapped, ctx, out, builders, expected, torch_dtype(dtype)),
        }


if __name__ == "__main__":
    from fsdp_matrix.standalone import main

    main(run, CASE)
