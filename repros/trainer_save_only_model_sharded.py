"""Trainer save_only_model with FSDP SHARDED_STATE_DICT: https://github.com/huggingface/transformers/issues/36626"""

from __future__ import annotations

from unittest import mock

from fsdp_matrix.case import (
    RankContext,
    axis,
    cell_dir,
    flag,
    main,
    peft_model,
    trainable_names,
    trainer_setup,
    trainer_train_and_check,
)

CASE = "trainer-save-only-model-sharded"
STATE_DICT_TYPES = {"full": "FULL_STATE_DICT", "sharded": "SHARDED_STATE_DICT"}


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    axis(params, "entry", ("trainer",))
    sdt = STATE_DICT_TYPES[axis(params, "sdt", tuple(STATE_DICT_TYPES))]
    only_model = bool(flag(params, "only_model"))
    model = peft_model(params, ctx)
    trainable = trainable_names(model)
    saving = dict(save_strategy="steps", save_steps=1, save_only_model=only_model, saves=True)
    # as an accelerate config file sets it: transformers 4.x passes no plugin and accelerate reads it from env;
    # the cell's own empty output_dir: a checkpoint folder left by another cell would hide the missing one
    with mock.patch.dict("os.environ", {"FSDP_STATE_DICT_TYPE": sdt}), cell_dir(ctx, params) as out:
        with trainer_setup(
            model, params, ctx, output_dir=str(out), fsdp_config={"state_dict_type": sdt}, **saving
        ) as trainer:
            checks = trainer_train_and_check(trainer, params, ctx, trainable)
            plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
        first = out / "checkpoint-1"
        held = sorted(p.name for p in first.iterdir()) if first.is_dir() else None
    return {"state_dict_type": str(getattr(plugin, "state_dict_type", None)), "checkpoint_1": held, **checks}


if __name__ == "__main__":
    main(run, CASE)
