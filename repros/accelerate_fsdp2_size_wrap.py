"""accelerate's FSDP2 size-based auto wrap picks the decoder ModuleList: not reported upstream (see the evidence)"""

from __future__ import annotations

from unittest import mock

from fsdp_matrix.case import (
    RankContext,
    accelerate_launch_env,
    axis,
    decoder_layer_class,
    fsdp_launch_config,
    main,
    peft_model,
    wrap_and_train,
)

CASE = "accelerate-fsdp2-size-wrap"
POLICIES = ("size", "transformer")
MIN_NUM_PARAMS = 10_000
"""Above every Linear of the tiny Llama (4,096-8,192 parameters), below one decoder layer (about 41,000): the
proportions of accelerate config's default 1e8 on a 7B-8B model, whose layers each hold about 2e8."""


def launch_config(policy: str, model, world_size: int) -> dict:
    """The ``accelerate config`` yaml of an FSDP2 user: size-based wrap with ``fsdp_min_num_params``, or the
    transformer-based wrap on the decoder layer; no ram-efficient loading (not what is under test here)."""
    config = fsdp_launch_config(decoder_layer_class(model).__name__, 2, True, world_size)
    fsdp = dict(config["fsdp_config"], fsdp_cpu_ram_efficient_loading=False, fsdp_sync_module_states=False)
    if policy == "size":
        fsdp.pop("fsdp_transformer_layer_cls_to_wrap")
        fsdp.update(fsdp_auto_wrap_policy="SIZE_BASED_WRAP", fsdp_min_num_params=MIN_NUM_PARAMS)
    return dict(config, fsdp_config=fsdp)


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    policy = axis(params, "policy", POLICIES)
    axis(params, "entry", ("accelerate",)), axis(params, "wrap", ("fsdp2",))
    model = peft_model(params, ctx)
    # the plugin comes from the launcher's variables, as in a script started with accelerate launch; on CPU also
    # ACCELERATE_USE_CPU, which accelerate's launcher exports for a use_cpu config (utils/launch.py)
    cpu = {"ACCELERATE_USE_CPU": "true"} if ctx.device.type == "cpu" else {}
    with accelerate_launch_env(launch_config(policy, model, ctx.world_size)) as exported:
        with mock.patch.dict("os.environ", cpu):
            checks = wrap_and_train(model, params, ctx)
    return {"min_num_params": exported.get("FSDP_MIN_NUM_PARAMS"), **checks}


if __name__ == "__main__":
    main(run, CASE)
