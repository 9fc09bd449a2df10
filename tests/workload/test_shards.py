"""The checks of workload/shards.py: each fails on a deliberately corrupted model, naming the tensor (or unit), the rank
and the size of the difference, and passes on a healthy one (for real on 2 ranks, the session fixture
``corruption_outcomes``); the share arithmetic on its own."""

from __future__ import annotations

import pytest

from fsdp_matrix.workload.shards import _share
from tests.workload.support import failed_on_both_ranks

LORA_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
LORA_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("scenario", ["fsdp2", "fsdp1", "bf16", "ignored"])
def test_a_healthy_model_passes_every_check(corruption_outcomes, scenario):
    for rank in (0, 1):
        got = corruption_outcomes[rank][scenario]
        assert got["status"] == "ok", got
        checks = got["checks"]
        assert checks["forward_max_diff"] == 0.0
        assert checks["shard_group"] == 2
        # each rank holds exactly half of every managed tensor (the tiny model's sizes divide evenly by 2)
        (dtype, promised), *_ = checks["bytes_promised"].items()
        assert checks["bytes_per_rank"] == {dtype: [promised, promised]}
        assert sum(checks["shards_changed"]) >= 8 and checks["shards_changed"][0] > 0
    assert corruption_outcomes[0]["ignored"]["checks"]["unmanaged_tensors"] == 1


@pytest.mark.timeout(600)
def test_one_ranks_copy_of_an_unmanaged_tensor_perturbed_fails(corruption_outcomes):
    # lora_A of one layer is in FSDP1's ignored_modules: a plain tensor on each rank; rank 1 nudges its copy by 1e-3
    message = failed_on_both_ranks(corruption_outcomes, "ranks_disagree")
    assert message == f"ranks disagree: rank 1's {LORA_A} differs from rank 0's by max |diff| 0.001"


@pytest.mark.timeout(600)
def test_a_unit_left_unsharded_fails(corruption_outcomes):
    # the policy gives decoder layer 0 NO_SHARD under a FULL_SHARD root
    message = failed_on_both_ranks(corruption_outcomes, "unsharded_unit")
    for rank in (0, 1):
        assert f"sharding: rank {rank} holds 84224 float32 bytes over the 201344 promised (shard group 2)" in message
    assert "unit base_model.model.model.layers.0 holds 42112/42112 float32 elements, its share over 2 ranks 21056" in (
        message
    )


@pytest.mark.timeout(600)
def test_a_base_upcast_before_wrapping_fails(corruption_outcomes):
    # the bf16 model cast to fp32 after the reference was taken, as prepare_model_for_kbit_training does
    message = failed_on_both_ranks(corruption_outcomes, "upcast")
    assert "sharding: rank 1 holds 201344 float32 bytes over the 0 promised (shard group 2)" in message
    assert "29 tensors upcast, e.g. base_model.model.lm_head.weight is float32, bfloat16 before wrapping" in message


@pytest.mark.timeout(600)
def test_one_ranks_shard_left_untrained_fails(corruption_outcomes):
    # rank 1 zeroes its shard of lora_B's gradient: the full tensor still changes (rank 0's half) and the summed
    # gradient is > 0, so only the per-shard check sees it
    message = failed_on_both_ranks(corruption_outcomes, "untrained_shard")
    assert message == (
        f"untrained: rank 1's piece of 1 trainable tensors did not change in training (max |change| 0), "
        f"e.g. {LORA_B} (512 bytes)"
    )


@pytest.mark.timeout(600)
def test_an_upstream_untrained_root_parameter_fails(corruption_outcomes):
    # pytorch#149205 (observed on torch 2.13): a forward before the optimizer is built leaves FSDP2's root unsharded;
    # the optimizer then steps plain copies and the head copy, a root parameter, never trains, without an error
    message = failed_on_both_ranks(corruption_outcomes, "forward_first")
    head = "base_model.model.lm_head.modules_to_save.default.weight"
    assert f"1/9 trainable tensors unchanged: ['{head}']" in message
    for rank in (0, 1):
        want = f"untrained: rank {rank}'s piece of 1 trainable tensors did not change in training (max |change| 0)"
        assert f"{want}, e.g. {head} (16384 bytes)" in message


def test_an_fsdp2_share_is_whole_rows():
    # FSDP2 shards dim 0: trainable-token deltas of 3 tokens x 64 leave rank 0 two rows, more than half the elements
    assert _share((3, 64), 2, "fsdp2") == 128
    assert _share((3, 64), 2, "fsdp1") == 96  # FSDP1 shards the flat parameter by element
    assert _share((64,), 4, "fsdp2") == 16 and _share((), 2, "fsdp2") == 1
