"""accelerate PR #3999 (1.14.0): FSDP2 with the transformer policy given as a callable shards only the root.

A plugin written as FSDP1 scripts and torch's FSDP docs write the policy,
``auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})``,
with ``fsdp_version=2``: ``set_auto_wrap_policy`` compares the policy with the bare function, so for a partial it
leaves ``transformer_cls_names_to_wrap`` unset, and the closure ``fsdp2_prepare_auto_wrap_policy`` builds returns
False for every module while that attribute is None. ``fully_shard`` then runs on the root alone: the whole model is
all-gathered for every forward, and nothing fails. 1.14.0's closure tests the class set it built (from the model's
``_no_split_modules``) instead.

The cell: LoRA on the tiny Llama through ``Accelerator.prepare``, FSDP2 with the layer class given by name
(``layer_cls: name``) or as that partial; FSDP1 with the partial, which it has always taken, as the contrast. The
collectives check (workload/collectives.py) finds the promised per-layer units missing.
"""

from __future__ import annotations

from fsdp_matrix.case import RankContext, main, peft_model, wrap_and_train

CASE = "accelerate-fsdp2-partial-policy"


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    return wrap_and_train(peft_model(params, ctx), params, ctx)


if __name__ == "__main__":
    main(run, CASE)
