"""The recipe's base and wrap halves (base_model, wrap_cell): what each reads from the cell's axes."""

from __future__ import annotations

import pytest
import torch

from fsdp_matrix.workload.checks import wrapper_kind
from fsdp_matrix.workload.recipe import base_model, wrap_cell
from tests.workload.support import cpu_context, one_rank_group


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recipe")
    one_rank_group(tmp)
    return cpu_context(tmp)


def test_base_model_reads_model_and_dtype_fp32_when_absent(ctx):
    assert {p.dtype for p in base_model({"model": "llama"}, ctx).parameters()} == {torch.float32}
    gemma = base_model({"model": "gemma", "dtype": "bf16"}, ctx)
    assert type(gemma).__name__.startswith("Gemma") and {p.dtype for p in gemma.parameters()} == {torch.bfloat16}


def test_base_model_refuses_an_unknown_model(ctx):
    with pytest.raises(ValueError, match="axis 'model': unknown value 'moe'"):
        base_model({"model": "moe"}, ctx)


@pytest.mark.parametrize(
    "params, kind",
    [({"wrap": "fsdp2"}, "fsdp2"), ({"wrap": "decoder_layer", "orig": 1}, "fsdp1")],
)
def test_wrap_cell_wraps_as_the_axes_say(ctx, params, kind):
    wrapped = wrap_cell(base_model({"model": "llama"}, ctx), params, ctx)
    assert wrapper_kind(wrapped) == kind
    if kind == "fsdp1":
        assert wrapped._use_orig_params is True


def test_wrap_cell_refuses_an_unknown_wrap(ctx):
    with pytest.raises(ValueError, match="axis 'wrap': unknown value 'ddp'"):
        wrap_cell(base_model({"model": "llama"}, ctx), {"wrap": "ddp"}, ctx)


def test_the_launcher_reference_is_the_checkpoint_loaded_plainly(ctx):
    from fsdp_matrix.workload.launcher import checkpoint_path
    from fsdp_matrix.workload.recipe import peft_model, reference_source

    assert reference_source({"adapter": "lora", "model": "gemma"}, ctx) is None
    params = {"adapter": "lora", "model": "gemma", "init": "launcher"}
    checkpoint_path("gemma", ctx)
    built = reference_source(params, ctx)()
    fresh = peft_model({"adapter": "lora", "model": "gemma"}, ctx)
    for (n, want), (m, got) in zip(fresh.state_dict().items(), built.state_dict().items()):
        assert n == m and torch.equal(got, want), n
