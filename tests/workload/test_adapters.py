from __future__ import annotations

import pytest
import torch

from fsdp_matrix.workload.adapters import adapter_dtypes, add_adapter, has_autocast_option, is_adapter
from fsdp_matrix.workload.models import build_model
from tests.workload.support import cpu_context


def test_is_adapter():
    assert is_adapter("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight")
    assert is_adapter("x.q_proj.lora_magnitude_vector.default.weight")
    assert not is_adapter("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight")


@pytest.mark.parametrize(
    "adapter,markers", [("lora", {"lora_A", "lora_B"}), ("dora", {"lora_A", "lora_B", "lora_magnitude_vector"})]
)
def test_add_adapter_trains_only_adapters(tmp_path, adapter, markers):
    model = add_adapter(build_model("llama", "fp32", cpu_context(tmp_path)), adapter, seed=0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(is_adapter(n) for n in trainable)
    assert {m for m in markers if any(m in n for n in trainable)} == markers


@pytest.mark.skipif(not has_autocast_option(), reason="this PEFT has no autocast_adapter_dtype")
@pytest.mark.parametrize("autocast,want", [(True, ["torch.float32"]), (False, ["torch.bfloat16"])])
def test_autocast_adapter_dtype(tmp_path, autocast, want):
    model = add_adapter(build_model("llama", "bf16", cpu_context(tmp_path)), "lora", seed=0, autocast=autocast)
    assert adapter_dtypes(model) == want


def test_same_seed_same_adapter(tmp_path):
    ctx = cpu_context(tmp_path)
    a = dict(add_adapter(build_model("llama", "fp32", ctx), "lora", seed=3).named_parameters())
    b = dict(add_adapter(build_model("llama", "fp32", ctx), "lora", seed=3).named_parameters())
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_unknown_adapter(tmp_path):
    with pytest.raises(ValueError, match="unknown adapter"):
        add_adapter(build_model("llama", "fp32", cpu_context(tmp_path)), "ia3", seed=0)


def test_lora_config_is_the_shared_rank4_lora():
    from fsdp_matrix.workload.adapters import TARGET_MODULES, lora_config

    config = lora_config()
    assert (config.r, config.lora_alpha, config.lora_dropout) == (4, 8, 0.0)
    assert sorted(config.target_modules) == sorted(TARGET_MODULES)
    assert config.task_type == "CAUSAL_LM"
    bare = lora_config(task_type=None, target_modules=["k_proj"], init_lora_weights=False, use_dora=True)
    assert (bare.task_type, sorted(bare.target_modules), bare.init_lora_weights, bare.use_dora) == (
        None,
        ["k_proj"],
        False,
        True,
    )


def test_lora_config_passes_an_unknown_option_to_peft():
    from fsdp_matrix.workload.adapters import lora_config

    # a rule expects PEFT's own TypeError for an option it does not have yet (moe-target-parameters)
    with pytest.raises(TypeError):
        lora_config(no_such_lora_option=1)
