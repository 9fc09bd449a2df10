from __future__ import annotations

import pytest
from torch.distributed.fsdp import FullyShardedDataParallel

from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.checks import wrapper_kind
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.wrapping import wrap
from tests.workload.support import cpu_context, one_rank_group


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wrapping")
    one_rank_group(tmp)
    return cpu_context(tmp)


def _lora(ctx):
    return add_adapter(build_model("llama", "fp32", ctx), "lora", seed=0)


def test_decoder_layer_orig0_mixes_frozen_and_trainable(ctx):
    # the lora-requires-grad error is raised while flattening, even on one rank: the unit mixes requires_grad
    with pytest.raises(ValueError, match="uniform `requires_grad`"):
        wrap(_lora(ctx), "decoder_layer", False, ctx)


@pytest.mark.parametrize("how,orig", [("decoder_layer", True), ("peft_policy", False), ("peft_policy", True)])
def test_fsdp1_wraps(ctx, how, orig):
    wrapped = wrap(_lora(ctx), how, orig, ctx)
    assert isinstance(wrapped, FullyShardedDataParallel)
    units = sum(isinstance(m, FullyShardedDataParallel) for m in wrapped.modules())
    # decoder_layer: root + 2 layers; PEFT's policy adds one unit per LoRA leaf (2 targets x A/B x 2 layers)
    assert units == (3 if how == "decoder_layer" else 11)
    assert wrapper_kind(wrapped) == "fsdp1"


def test_fsdp2(ctx):
    assert wrapper_kind(wrap(_lora(ctx), "fsdp2", None, ctx)) == "fsdp2"


def test_fsdp1_needs_orig_and_known_wrap(ctx):
    with pytest.raises(ValueError, match="needs the orig"):
        wrap(_lora(ctx), "decoder_layer", None, ctx)
    with pytest.raises(ValueError, match="unknown wrap"):
        wrap(_lora(ctx), "ddp", True, ctx)


@pytest.mark.parametrize("shard,strategy", [("full", "FULL_SHARD"), ("grad_op", "SHARD_GRAD_OP")])
def test_shard_axis_asks_fsdp1_for_the_strategy(ctx, shard, strategy):
    # on one rank FSDP1 replaces any sharded strategy with NO_SHARD and says which one it was asked for
    with pytest.warns(UserWarning, match=f"instead of ShardingStrategy.{strategy} since the world size is 1"):
        wrap(_lora(ctx), "decoder_layer", True, ctx, shard=shard)


def test_shard_none_is_no_shard(ctx):
    wrapped = wrap(_lora(ctx), "decoder_layer", True, ctx, shard="none")
    units = [m for m in wrapped.modules() if isinstance(m, FullyShardedDataParallel)]
    assert units and {u.sharding_strategy.name for u in units} == {"NO_SHARD"}


def test_mp_axis_sets_a_mixed_precision_policy(ctx):
    wrapped = wrap(_lora(ctx), "decoder_layer", True, ctx, mp="bf16")
    assert str(wrapped.mixed_precision.param_dtype) == "torch.bfloat16"
    assert wrap(_lora(ctx), "decoder_layer", True, ctx).mixed_precision.param_dtype is None


def test_shard_and_mp_are_fsdp1_only_and_checked(ctx):
    with pytest.raises(ValueError, match="FSDP1 settings"):
        wrap(_lora(ctx), "fsdp2", None, ctx, shard="none")
    with pytest.raises(ValueError, match="unknown shard"):
        wrap(_lora(ctx), "decoder_layer", True, ctx, shard="hybrid")
    with pytest.raises(ValueError, match="unknown mp"):
        wrap(_lora(ctx), "decoder_layer", True, ctx, mp="fp8")
