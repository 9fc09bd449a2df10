"""The forward check of workload/corruption.py: it fails on a model whose forward a wrapped layer changes, naming the
first module that differs, each rank and the size of the difference, and passes on a healthy one (for real on 2
ranks, the session fixture ``corruption_outcomes``); the reference's pieces on one rank."""

from __future__ import annotations

import pytest
import torch

from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.corruption import LOGITS_TOLERANCE, Reference, as_reference, take_reference, tolerance
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import wrap
from tests.workload.support import cpu_context, failed_on_both_ranks, one_rank_group

DOWN = "base_model.model.model.layers.0.mlp.down_proj"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("scenario", ["fsdp2", "fsdp1", "bf16", "ignored"])
def test_a_healthy_forward_equals_the_unwrapped_one(corruption_outcomes, scenario):
    for rank in (0, 1):
        assert corruption_outcomes[rank][scenario]["checks"]["forward_max_diff"] == 0.0


@pytest.mark.timeout(600)
@pytest.mark.parametrize("scenario", ["scaled_fsdp2", "scaled_fsdp1"])
def test_a_forward_changed_by_a_wrapped_layer_fails(corruption_outcomes, scenario):
    # the layer's scale is an attribute of its Parameter (as Params4bit's quant_state): FSDP's own tensors lack it
    message = failed_on_both_ranks(corruption_outcomes, scenario)
    for rank in (0, 1):
        assert f"forward: rank {rank}'s logits differ from the unwrapped model's by max |diff| 0.0939" in message
    assert f"first differing module {DOWN} (max |diff| 0.0121)" in message


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
    assert tolerance(torch.float32, torch.bfloat16) == LOGITS_TOLERANCE[torch.bfloat16]
    assert tolerance(torch.float32) == LOGITS_TOLERANCE[torch.float32]
