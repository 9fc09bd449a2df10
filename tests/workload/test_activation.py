"""The ``ac`` axis (workload/activation.py): how each entry is told to checkpoint, and the structural check's
expectation per value (units.py), for real through the torch entry on a one-rank gloo group. Each promise is broken
on purpose and seen caught: a cell asking ``fsdp`` whose layers were never wrapped, or with a wrapper around another
module; ``hf`` whose flag is off, or with a wrapper instead; ``none`` with checkpointing on. Each trains without an
error and passes every other check."""

from __future__ import annotations

import os

import pytest
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.activation import (
    AC_ENV,
    ac_fsdp_config,
    ac_kind,
    ac_of,
    ac_trainer_kwargs,
    count_attention_calls,
    enable_hf_ac,
    torch_fsdp_ac,
)
from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.entry import isolated_accelerate_state, make_plugin
from fsdp_matrix.workload.hf_trainer import trainer_fsdp_config
from fsdp_matrix.workload.knobs import knobs_of, trainer_kwargs
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.params import UnknownAxisValue
from fsdp_matrix.workload.recipe import peft_model, wrap_and_train
from fsdp_matrix.workload.training import train_and_check
from fsdp_matrix.workload.units import _decoder_layers, _kind_failures
from fsdp_matrix.workload.wrapping import wrap
from tests.workload.support import cpu_context, one_rank_group

BASE = {"adapter": "lora", "dtype": "fp32", "model": "llama"}
LAYERS = ["base_model.model.model.layers.0", "base_model.model.model.layers.1"]


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("activation")
    one_rank_group(tmp)
    return cpu_context(tmp)


def _lora(ctx):
    return add_adapter(build_model("llama", "fp32", ctx), "lora", seed=0)


def test_values_and_what_the_check_expects():
    assert ac_of({}) == "none" and ac_kind({}) is None and ac_kind(None) is None
    assert [ac_kind({"ac": v}) for v in ("none", "fsdp", "hf_reentrant", "hf_nonreentrant")] == [
        "none",
        "fsdp",
        "hf",
        "hf",
    ]
    with pytest.raises(UnknownAxisValue, match="axis 'ac': unknown value 'torch_ac'"):
        ac_of({"ac": "torch_ac"})


def test_the_trainer_is_told_as_its_users_tell_it(ctx):
    assert ac_fsdp_config({"ac": "fsdp"}) == {"activation_checkpointing": True}
    assert ac_fsdp_config({"ac": "hf_reentrant"}) == {} == ac_trainer_kwargs({"ac": "fsdp"})
    assert ac_trainer_kwargs({"ac": "hf_nonreentrant"}) == {
        "gradient_checkpointing": True,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
    }
    model = _lora(ctx)
    assert trainer_fsdp_config(model, {"wrap": "fsdp2", "ac": "fsdp"})["activation_checkpointing"] is True
    assert "activation_checkpointing" not in trainer_fsdp_config(model, {"wrap": "fsdp2"})
    knobbed = trainer_kwargs(knobs_of({"ac": "hf_reentrant"}), ctx.device)
    assert knobbed["gradient_checkpointing_kwargs"] == {"use_reentrant": True}
    # explicit off for the other values (TRL's configs default it on); a cell without the axis is left as it was
    assert trainer_kwargs(knobs_of({"ac": "fsdp"}), ctx.device) == {"gradient_checkpointing": False}
    assert trainer_kwargs(knobs_of({}), ctx.device) == {}


def test_the_accelerate_plugin_is_told_as_accelerate_config_writes_it(ctx):
    model = _lora(ctx)
    with isolated_accelerate_state():
        plugin = make_plugin(model, {"wrap": "decoder_layer", "orig": 1, "ac": "fsdp"})
        assert plugin.activation_checkpointing is True and os.environ[AC_ENV] == "true"
    assert AC_ENV not in os.environ  # restored with the cell's accelerate state
    with isolated_accelerate_state():
        assert make_plugin(model, {"wrap": "decoder_layer", "orig": 1}).activation_checkpointing is False


@pytest.mark.parametrize("how", ["decoder_layer", "fsdp2"])
@pytest.mark.parametrize("ac", ["fsdp", "hf_nonreentrant"])
def test_each_value_trains_with_the_structure_it_promises(ctx, how, ac):
    params = {**BASE, "wrap": how, "ac": ac, **({"orig": 1} if how == "decoder_layer" else {})}
    summary = wrap_and_train(peft_model(params, ctx), params, ctx)["structure"]
    assert summary["failed"] == 0, summary
    if ac == "fsdp":
        assert summary["checkpoint_wrapped"] == LAYERS and summary["checkpoint_flagged"] == []
    else:  # transformers 4.x flags the decoder stack, 5.x each layer (and maybe the stack)
        assert summary["checkpoint_wrapped"] == [] and summary["checkpoint_flagged"]


def _fsdp2(ctx, ac_on=None):
    model = _lora(ctx)
    names = trainable_names(model)
    if ac_on == "fsdp":
        torch_fsdp_ac(model)
    elif ac_on == "hf":
        enable_hf_ac(model, {"ac": "hf_nonreentrant"})
    return wrap(model, "fsdp2", None, ctx), names


def test_fsdp_asked_and_nothing_wrapped_fails(ctx):
    wrapped, names = _fsdp2(ctx)
    with pytest.raises(CheckFailed, match=r"structure: ac fsdp, 2/2 decoder layers not checkpoint-wrapped"):
        train_and_check(wrapped, ctx, trainable=names, params={"wrap": "fsdp2", "ac": "fsdp"})


def test_fsdp_asked_and_another_module_wrapped_fails(ctx):
    model = _lora(ctx)
    names = trainable_names(model)
    torch_fsdp_ac(model)
    inner = model.base_model.model.model
    inner.norm = checkpoint_wrapper(inner.norm)
    with pytest.raises(CheckFailed, match=r"ac fsdp, 1 checkpoint wrappers around modules not decoder layers"):
        train_and_check(wrap(model, "fsdp2", None, ctx), ctx, trainable=names, params={"wrap": "fsdp2", "ac": "fsdp"})


def test_hf_asked_and_the_flag_off_fails(ctx):
    wrapped, names = _fsdp2(ctx)
    with pytest.raises(CheckFailed, match=r"ac hf, 2/2 decoder layers under no gradient_checkpointing flag"):
        train_and_check(wrapped, ctx, trainable=names, params={"wrap": "fsdp2", "ac": "hf_nonreentrant"})


def test_hf_asked_and_wrappers_found_fails(ctx):
    wrapped, names = _fsdp2(ctx, "fsdp")
    with pytest.raises(CheckFailed, match=r"ac hf, yet 2 modules in a CheckpointWrapper"):
        train_and_check(wrapped, ctx, trainable=names, params={"wrap": "fsdp2", "ac": "hf_reentrant"})


@pytest.mark.parametrize("on", ["fsdp", "hf"])
def test_none_asked_and_checkpointing_on_fails(ctx, on):
    wrapped, names = _fsdp2(ctx, on)
    with pytest.raises(CheckFailed, match=r"structure: ac none, yet \d checkpoint-wrapped and \d gradient_check"):
        train_and_check(wrapped, ctx, trainable=names, params={"wrap": "fsdp2", "ac": "none"})


def test_an_hf_flag_on_a_module_above_the_layers_covers_them(ctx):
    layers = _decoder_layers(_lora(ctx))
    assert layers == LAYERS
    assert _kind_failures([], ["base_model.model.model"], layers, "hf") == []
    assert _kind_failures([], ["base_model.model.model.layers.0"], layers, "hf") == [
        "structure: ac hf, 1/2 decoder layers under no gradient_checkpointing flag"
    ]
    assert "transformers' gradient_checkpointing flag on too" in _kind_failures(LAYERS, LAYERS, layers, "fsdp")[0]


@pytest.mark.parametrize("reentrant", [True, False])
def test_attention_calls_tell_the_recompute_from_the_forward(ctx, reentrant):
    import torch

    model = _lora(ctx)
    calls = count_attention_calls(model)
    batch = torch.randint(0, 64, (2, 8))
    model(input_ids=batch).logits.sum().backward()
    layers = len(_decoder_layers(model))
    assert (calls.forward, calls.in_backward) == (layers, 0)  # no checkpointing: nothing recomputed
    model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.enable_input_require_grads()
    model.train()
    model(input_ids=batch).logits.sum().backward()
    assert (calls.forward, calls.in_backward) == (2 * layers, layers) and calls.total == 3 * layers
