from __future__ import annotations

import pytest
import torch

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import wrap
from tests.workload.support import cpu_context, one_rank_group


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("training")
    one_rank_group(tmp)
    return cpu_context(tmp)


def _lora(ctx, dtype="fp32"):
    return add_adapter(build_model("llama", dtype, ctx), "lora", seed=0)


@pytest.mark.parametrize("how,orig", [(None, None), ("peft_policy", False), ("decoder_layer", True), ("fsdp2", None)])
def test_training_passes_its_checks(ctx, how, orig):
    model = _lora(ctx)
    model = model if how is None else wrap(model, how, orig, ctx)
    checks = train_and_check(model, ctx)
    assert checks["frozen_compared"] == 21 and checks["frozen_changed"] == []
    assert checks["adapter_changed"] == checks["adapter_tensors"] == 8
    assert len(checks["losses"]) == 3 and checks["losses"][-1] < checks["losses"][0]
    assert all(n > 0 for n in checks["grad_norms"][1:])


def test_a_trained_base_weight_fails_the_frozen_check(ctx):
    model = _lora(ctx)
    name, weight = next((n, p) for n, p in model.named_parameters() if "q_proj.base_layer" in n)
    weight.requires_grad_(True)
    with pytest.raises(CheckFailed, match=r"1/21 frozen base tensors changed"):
        train_and_check(wrap(model, "decoder_layer", True, ctx), ctx)


def test_a_nan_loss_fails_the_loss_check(ctx):
    model = _lora(ctx)
    with torch.no_grad():
        model.base_model.model.model.embed_tokens.weight.fill_(float("nan"))
    with pytest.raises(CheckFailed, match="loss not finite"):
        train_and_check(model, ctx)


def test_synthetic_batch_is_fixed(ctx):
    assert torch.equal(synthetic_batch(ctx), synthetic_batch(ctx))
    assert synthetic_batch(ctx).max() < 128
