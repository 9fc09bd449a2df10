"""The entry axis: what each entry asks accelerate and the Trainer for, and how a wrong wrapper is caught.

The 2-process runs through accelerate's real FSDP code are the matrix cells themselves and
test_accelerate_launch.py; these tests check the pieces that need no process group."""

from __future__ import annotations

import contextlib
import os

import pytest
from accelerate.state import AcceleratorState, PartialState

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload import entry
from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.entry import (
    entry_mixed_precision,
    entry_of,
    isolated_accelerate_state,
    make_plugin,
    require_wrapper,
)
from fsdp_matrix.workload.hf_trainer import trainer_fsdp_config
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.wrapping import wrap
from tests.workload.support import cpu_context, one_rank_group


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("entry")
    one_rank_group(tmp)
    return cpu_context(tmp)


def _lora(ctx):
    return add_adapter(build_model("llama", "fp32", ctx), "lora", seed=0)


def test_entry_defaults_to_torch_and_refuses_unknown():
    assert entry_of({}) == "torch" and entry_of({"entry": "trainer"}) == "trainer"
    with pytest.raises(ValueError, match="axis 'entry': unknown value 'deepspeed'"):
        entry_of({"entry": "deepspeed"})


@pytest.mark.parametrize("orig", [0, 1])
def test_plugin_carries_the_cell_axes(ctx, orig):
    with isolated_accelerate_state():
        plugin = make_plugin(_lora(ctx), {"wrap": "decoder_layer", "orig": orig})
        assert plugin.use_orig_params is bool(orig) and plugin.sync_module_states is False
        assert getattr(plugin, "fsdp_version", 1) == 1
    assert "FSDP_USE_ORIG_PARAMS" not in os.environ  # exported for accelerate <= 0.29, then restored


def test_plugin_takes_peft_policy(ctx):
    model = _lora(ctx)
    with isolated_accelerate_state():
        plugin = make_plugin(model, {"wrap": "peft_policy", "orig": 0})
    assert plugin.auto_wrap_policy.func.__name__ == "_or_policy"


def test_plugin_takes_the_layer_class_by_name_or_as_a_partial(ctx):
    model = _lora(ctx)
    with isolated_accelerate_state():
        plugin = make_plugin(model, {"wrap": "decoder_layer", "orig": 1, "layer_cls": "partial"})
        policy = plugin.auto_wrap_policy
        assert policy.func.__name__ == "transformer_auto_wrap_policy"
        assert {c.__name__ for c in policy.keywords["transformer_layer_cls"]} == {"LlamaDecoderLayer"}
        assert getattr(plugin, "transformer_cls_names_to_wrap", None) is None  # what accelerate < 1.14 trips on
        named = make_plugin(model, {"wrap": "decoder_layer", "orig": 1, "layer_cls": "name"})
        if hasattr(named, "transformer_cls_names_to_wrap"):  # accelerate <= 0.29 takes the class from the env
            assert named.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
        with pytest.raises(ValueError, match="axis 'layer_cls': unknown value 'string'"):
            make_plugin(model, {"wrap": "decoder_layer", "orig": 1, "layer_cls": "string"})


def test_isolated_state_starts_and_ends_empty(monkeypatch):
    PartialState._shared_state["marker"] = 1
    with isolated_accelerate_state():
        assert "marker" not in PartialState._shared_state
        AcceleratorState._shared_state["inside"] = 1
        os.environ["FSDP_MATRIX_TEST_VAR"] = "x"
    assert not AcceleratorState._shared_state and "FSDP_MATRIX_TEST_VAR" not in os.environ


def test_trainer_config_as_users_write_it(ctx):
    model = _lora(ctx)
    config = trainer_fsdp_config(model, {"wrap": "decoder_layer", "orig": 0})
    assert config == {
        "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
        "version": 1,
        "sync_module_states": "false",
        "use_orig_params": "false",
    }
    assert trainer_fsdp_config(model, {"wrap": "fsdp2"})["version"] == 2
    with pytest.raises(ValueError, match="no setting for PEFT's policy"):
        trainer_fsdp_config(model, {"wrap": "peft_policy", "orig": 1})


def test_a_wrapper_other_than_the_one_asked_for_fails(ctx):
    fsdp1 = wrap(_lora(ctx), "decoder_layer", True, ctx)
    assert require_wrapper(fsdp1, 1) == "fsdp1"
    with pytest.raises(CheckFailed, match=r"model is FullyShardedDataParallel \(fsdp1\), not FSDP2"):
        require_wrapper(fsdp1, 2)
    with pytest.raises(CheckFailed, match=r"model is PeftModelForCausalLM \(none\), not FSDP1"):
        require_wrapper(_lora(ctx), 1)


def test_prepare_and_train_inspects_the_prepared_model_before_training(monkeypatch):
    # the glue alone: accelerate's real prepare and training run in the accelerate cells of the matrix
    calls = []

    class Setup:
        model, optimizer = "prepared", "accelerate's optimizer"
        accelerator = type("Acc", (), {"backward": "accelerate's backward", "mixed_precision": "bf16"})()
        plugin = type("Plugin", (), {"activation_checkpointing": True})()

        def checks(self):
            calls.append("setup.checks")
            return {"entry": "accelerate"}

    @contextlib.contextmanager
    def fake_setup(model, params, ctx, **_):  # e.g. mixed_precision, which prepare_and_train passes since e628b60
        calls.append(("prepare", model))
        yield Setup()
        calls.append("leave")

    def fake_train(model, ctx, **kwargs):
        calls.append(("train", model, kwargs))
        return {"losses": [1.0]}

    monkeypatch.setattr(entry, "accelerate_setup", fake_setup)
    monkeypatch.setattr(entry, "train_and_check", fake_train)

    def inspect(model):
        calls.append(("inspect", model))
        return {"x": 1}

    checks = entry.prepare_and_train("model", {}, "ctx", ["a"], inspect=inspect)
    assert checks == {"entry": "accelerate", "x": 1, "losses": [1.0]}
    kwargs = {"trainable": ["a"], "optimizer": "accelerate's optimizer", "backward": "accelerate's backward"}
    # the knobs' loop (accum, clip, compile) goes along as accelerate's own: accumulate(), clip_grad_norm_
    loop = calls[3][2].pop("loop")
    entry_settings = {"mixed_precision": "bf16", "checkpointing": True}
    assert (loop.knobs.accum, loop.knobs.clip, loop.knobs.compile) == (1, None, "none")
    assert calls == [
        ("prepare", "model"),
        "setup.checks",
        ("inspect", "prepared"),
        # the structural and dtype checks read the entry's settings as accelerate holds them
        ("train", "prepared", {**kwargs, "reference": None, "params": {}, "entry": entry_settings}),
        "leave",
    ]


def test_the_accelerate_entry_refuses_a_root_wrap_naming_itself_not_the_repro():
    """``wrap: fsdp2_root`` with the accelerate entry said "this repro takes: ..."."""
    from fsdp_matrix.workload.entry import accelerate_wrap

    assert accelerate_wrap({"wrap": "fsdp2"}) == "fsdp2"
    with pytest.raises(ValueError, match=r"the accelerate entry does not build 'fsdp2_root' .*entry: torch") as err:
        accelerate_wrap({"wrap": "fsdp2_root"})
    assert "this repro" not in str(err.value)


def test_accelerate_setup_takes_a_plugin_of_ones_own(ctx, monkeypatch):
    """The facade could not build a size-based wrap: a newcomer set ACCELERATE_USE_CPU by hand instead. One rank
    here (accelerate wraps nothing at world size 1, so the wrapper check is the cells' job): the plugin handed in is
    the one accelerate gets, and the cell's own is not built."""
    import functools

    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    from fsdp_matrix.case import accelerate_setup

    with isolated_accelerate_state():
        own = FullyShardedDataParallelPlugin(
            auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=1000), use_orig_params=True
        )
    monkeypatch.setattr(entry, "require_wrapper", lambda model, version: "fsdp1")
    monkeypatch.setattr(entry, "make_plugin", lambda *a, **k: pytest.fail("the cell's own plugin was built"))
    with accelerate_setup(_lora(ctx), {"wrap": "decoder_layer", "orig": 1}, ctx, plugin=own) as setup:
        assert setup.plugin is own


def test_the_mp_axis_is_the_entrys_mixed_precision_setting():
    """accelerate's ``mixed_precision`` and the Trainer's ``bf16`` come from the ``mp`` axis; ``no`` without it."""
    assert entry_mixed_precision({"mp": "bf16"}) == "bf16"
    assert entry_mixed_precision({}) == "no"
    with pytest.raises(ValueError, match="fp8"):
        entry_mixed_precision({"mp": "fp8"})
