"""The silent-corruption checks (workload/corruption.py): each fails on a deliberately corrupted model, naming the
tensor, the rank and the size of the difference, and passes on a healthy one. For real on 2 ranks (gloo), through
``train_and_check`` with a reference taken before wrapping (scratch_corruption.py); a few pieces on one rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.corruption import TOLERANCE, Reference, as_reference, take_reference, tolerance
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.training import synthetic_batch, train_and_check, trainable_names
from fsdp_matrix.workload.wrapping import wrap
from tests.workload.support import cpu_context, one_rank_group, run_two_ranks

SCRATCH = Path(__file__).with_name("scratch_corruption.py")
LORA_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
LORA_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"
DOWN = "base_model.model.model.layers.0.mlp.down_proj"


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every scenario of scratch_corruption.py, by rank."""
    out = tmp_path_factory.mktemp("corruption")
    proc = run_two_ranks(SCRATCH, str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def _failed(outcomes, scenario):
    got = [o[scenario] for o in outcomes]
    assert [g["status"] for g in got] == ["CheckFailed", "CheckFailed"], got
    assert got[0]["message"] == got[1]["message"]  # every rank reaches the same verdict
    return got[0]["message"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("scenario", ["fsdp2", "fsdp1", "bf16", "ignored"])
def test_a_healthy_model_passes_every_check(outcomes, scenario):
    for rank in (0, 1):
        got = outcomes[rank][scenario]
        assert got["status"] == "ok", got
        checks = got["checks"]
        assert checks["forward_max_diff"] == 0.0
        assert checks["shard_group"] == 2
        # each rank holds exactly half of every managed tensor (the tiny model's sizes divide evenly by 2)
        (dtype, promised), *_ = checks["bytes_promised"].items()
        assert checks["bytes_per_rank"] == {dtype: [promised, promised]}
        assert sum(checks["shards_changed"]) >= 8 and checks["shards_changed"][0] > 0
    assert outcomes[0]["ignored"]["checks"]["unmanaged_tensors"] == 1


@pytest.mark.timeout(600)
def test_one_ranks_copy_of_an_unmanaged_tensor_perturbed_fails(outcomes):
    # lora_A of one layer is in FSDP1's ignored_modules: a plain tensor on each rank; rank 1 nudges its copy by 1e-3
    message = _failed(outcomes, "ranks_disagree")
    assert message == f"ranks disagree: rank 1's {LORA_A} differs from rank 0's by max |diff| 0.001"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("scenario", ["scaled_fsdp2", "scaled_fsdp1"])
def test_a_forward_changed_by_a_wrapped_layer_fails(outcomes, scenario):
    # the layer's scale is an attribute of its Parameter (as Params4bit's quant_state): FSDP's own tensors lack it
    message = _failed(outcomes, scenario)
    for rank in (0, 1):
        assert f"forward: rank {rank}'s logits differ from the unwrapped model's by max |diff| 0.0939" in message
    assert f"first differing module {DOWN} (max |diff| 0.0121)" in message


@pytest.mark.timeout(600)
def test_a_unit_left_unsharded_fails(outcomes):
    # the policy gives decoder layer 0 NO_SHARD under a FULL_SHARD root
    message = _failed(outcomes, "unsharded_unit")
    for rank in (0, 1):
        assert f"sharding: rank {rank} holds 84224 float32 bytes over the 201344 promised (shard group 2)" in message
    assert "unit base_model.model.model.layers.0 holds 42112/42112 float32 elements, its share over 2 ranks 21056" in (
        message
    )


@pytest.mark.timeout(600)
def test_a_base_upcast_before_wrapping_fails(outcomes):
    # the bf16 model cast to fp32 after the reference was taken, as prepare_model_for_kbit_training does
    message = _failed(outcomes, "upcast")
    assert "sharding: rank 1 holds 201344 float32 bytes over the 0 promised (shard group 2)" in message
    assert "29 tensors upcast, e.g. base_model.model.lm_head.weight is float32, bfloat16 before wrapping" in message


@pytest.mark.timeout(600)
def test_one_ranks_shard_left_untrained_fails(outcomes):
    # rank 1 zeroes its shard of lora_B's gradient: the full tensor still changes (rank 0's half) and the summed
    # gradient is > 0, so only the per-shard check sees it
    message = _failed(outcomes, "untrained_shard")
    assert message == (
        f"untrained: rank 1's piece of 1 trainable tensors did not change in training (max |change| 0), "
        f"e.g. {LORA_B} (512 bytes)"
    )


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corruption-one-rank")
    one_rank_group(tmp)
    return cpu_context(tmp)


def test_a_reference_may_be_logits_or_a_callable(ctx):
    model = add_adapter(build_model("llama", "fp32", ctx), "lora", seed=0)
    batch = synthetic_batch(ctx)
    taken = take_reference(model, batch)
    assert taken.error is None and taken.logits.shape == (2, 16, 128) and len(taken.params) == 29
    assert torch.equal(as_reference(taken.logits, batch).logits, taken.logits)
    assert torch.equal(as_reference(lambda b: model(input_ids=b).logits, batch).logits, taken.logits)
    checks = train_and_check(wrap(model, "fsdp2", None, ctx), ctx, trainable=trainable_names(model), reference=taken)
    # world size 1: nothing is sharded, and nothing is promised to be
    assert checks["shard_group"] == 1 and checks["forward_max_diff"] == 0.0
    assert checks["bytes_per_rank"]["float32"] == [checks["bytes_promised"]["float32"]]


def test_a_forward_that_raises_leaves_the_check_unrun(ctx):
    model = add_adapter(build_model("llama", "fp32", ctx), "lora", seed=0)
    taken = take_reference(model, torch.full((2, 16), 10_000, dtype=torch.long))  # ids beyond the vocabulary
    assert taken.logits is None and taken.error.startswith("IndexError")
    assert isinstance(taken, Reference) and taken.params


def test_tolerance_is_the_coarsest_dtypes():
    assert tolerance(torch.float32, torch.bfloat16) == TOLERANCE[torch.bfloat16]
    assert tolerance(torch.float32) == TOLERANCE[torch.float32]
