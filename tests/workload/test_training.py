"""train_and_check and its checks: trainability comes from requires_grad, never from name markers, so every PEFT
method is judged right, and every way of breaking training is caught."""

from __future__ import annotations

import inspect
from pathlib import Path

import peft
import pytest
import torch
from torch import nn

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.checks import TrainingChecks, trainable_names
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import wrap
from tests.workload.support import cpu_context, one_rank_group

WRAPS = [("peft_policy", False), ("decoder_layer", True), ("peft_policy", True), ("fsdp2", None)]


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("training")
    one_rank_group(tmp)
    return cpu_context(tmp)


def _lora(ctx, dtype="fp32"):
    return add_adapter(build_model("llama", dtype, ctx), "lora", seed=0)


def _peft(ctx, config):
    torch.manual_seed(0)
    return peft.get_peft_model(build_model("llama", "fp32", ctx), config)


@pytest.mark.parametrize("how,orig", WRAPS)
def test_training_passes_its_checks(ctx, how, orig):
    model = _lora(ctx)
    names = trainable_names(model)
    checks = train_and_check(wrap(model, how, orig, ctx), ctx, trainable=names)
    assert checks["frozen_compared"] == 21 and checks["frozen_changed"] == []
    assert checks["trainable_changed"] == checks["trainable_tensors"] == checks["trainable_with_grad"] == 8
    assert len(checks["losses"]) == 3 and checks["losses"][-1] < checks["losses"][0]
    assert all(n > 0 for n in checks["grad_norms"][1:])


@pytest.mark.parametrize("how,orig", WRAPS)
def test_trainable_names_survive_wrapping(ctx, how, orig):
    # FSDP1 use_orig_params=False registers only FlatParameters: their _fqns must give back the same names
    model = _lora(ctx)
    names = trainable_names(model)
    assert len(names) == 8 and all(".lora_" in n for n in names)
    assert trainable_names(wrap(model, how, orig, ctx)) == names


def test_per_tensor_gradients_match_across_wrappers(ctx):
    # the FlatParameter's gradient shard is split per original tensor: each must carry that tensor's gradient
    batch = synthetic_batch(ctx)
    grads = []
    for how, orig in [("peft_policy", False), ("decoder_layer", True)]:
        model = _lora(ctx)
        torch.manual_seed(1)
        with torch.no_grad():  # lora_B starts at zero, and with it lora_A's gradient
            for name, param in model.named_parameters():
                if ".lora_B." in name:
                    param.normal_()
        model = wrap(model, how, orig, ctx)
        judge = TrainingChecks(None, ctx.device)
        judge.snapshot(model)
        model(input_ids=batch, labels=batch).loss.backward()
        judge.record_grads(model)
        grads.append({n: v for n, v in judge.grad_steps[0].items() if n in judge.trainable})
    assert sorted(grads[0]) == sorted(grads[1]) and len(grads[0]) == 8
    for name in grads[0]:
        assert grads[0][name] > 0 and grads[0][name] == pytest.approx(grads[1][name], rel=1e-4), name


def _method_configs(tokens):
    kw = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    configs = {
        "modules_to_save": peft.LoraConfig(modules_to_save=["lm_head"], **kw),
        "ia3": peft.IA3Config(
            target_modules=["q_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"], task_type="CAUSAL_LM"
        ),
        "prompt_tuning": peft.PromptTuningConfig(num_virtual_tokens=4, task_type="CAUSAL_LM"),
    }
    if "trainable_token_indices" in inspect.signature(peft.LoraConfig).parameters:
        configs["trainable_tokens"] = peft.LoraConfig(trainable_token_indices=tokens, **kw)
    if hasattr(peft, "VeraConfig"):
        configs["vera"] = peft.VeraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return configs


# trainable tokens only get a gradient where they occur in the input (absent ones were caught by the no-gradient
# check): take them from the synthetic batch
METHODS = _method_configs(sorted({int(t) for t in synthetic_batch(cpu_context(Path("/tmp")))[0, :3]}))


@pytest.mark.parametrize("how,orig", [("decoder_layer", True), ("fsdp2", None)])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_other_peft_methods_pass_the_checks(ctx, method, how, orig):
    model = _peft(ctx, METHODS[method])
    names = trainable_names(model)
    assert names and not all(".lora_" in n for n in names)  # what a lora_ marker would have misjudged
    checks = train_and_check(wrap(model, how, orig, ctx), ctx, trainable=names)
    assert checks["trainable_changed"] == checks["trainable_with_grad"] == checks["trainable_tensors"] == len(names)
    assert checks["frozen_changed"] == [] and checks["frozen_compared"] > 0


def test_modules_to_save_without_names_from_before_wrapping(ctx):
    # the case API as user repros call it: no trainable names, so they come from the wrapped model
    model = _peft(ctx, METHODS["modules_to_save"])
    checks = train_and_check(wrap(model, "decoder_layer", True, ctx), ctx)
    assert checks["trainable_tensors"] == 9 and checks["frozen_changed"] == []


def test_a_trained_but_marked_frozen_tensor_fails(ctx):
    model = _lora(ctx)
    names = trainable_names(model)
    name, weight = next((n, p) for n, p in model.named_parameters() if "q_proj.base_layer" in n)
    weight.requires_grad_(True)
    with pytest.raises(CheckFailed, match=r"1/21 frozen tensors changed: \['base_model.*q_proj.base_layer.weight"):
        train_and_check(wrap(model, "decoder_layer", True, ctx), ctx, trainable=names)


def test_a_frozen_tensor_changed_outside_the_optimizer_fails(ctx):
    wrapped = wrap(_lora(ctx), "fsdp2", None, ctx)

    def nudge(module, args):
        # before FSDP2's own pre-forward hook, while the parameter is still the sharded DTensor
        with torch.no_grad():
            module.base_model.model.model.norm.weight.to_local().add_(1.0)

    wrapped.register_forward_pre_hook(nudge, prepend=True)
    with pytest.raises(CheckFailed, match=r"1/21 frozen tensors changed: \['base_model.model.model.norm.weight'\]"):
        train_and_check(wrapped, ctx)


def test_a_trainable_tensor_without_gradient_fails():
    # weight decay moves a tensor whose gradient is zero: "changed" alone does not prove it trained
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    model[0].weight.requires_grad_(False)
    judge = TrainingChecks(None, torch.device("cpu"))
    judge.snapshot(model)
    out = model(torch.ones(2, 3)).sum()
    out.backward()
    model[1].bias.grad.zero_()
    judge.record_grads(model)
    judge.record_loss(float(out))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.mul_(0.5)
    with pytest.raises(CheckFailed, match=r"1/3 trainable tensors got no gradient: \['1.bias'\]") as err:
        judge.finish(model)
    assert "not FSDP" in str(err.value) and "frozen tensors changed" not in str(err.value)


def test_an_unwrapped_model_is_not_fsdp(ctx):
    with pytest.raises(CheckFailed, match="model is PeftModelForCausalLM \\(none\\), not FSDP"):
        train_and_check(_lora(ctx), ctx)


def test_a_ddp_model_is_not_fsdp(ctx):
    ddp = nn.parallel.DistributedDataParallel(_lora(ctx))
    with pytest.raises(CheckFailed, match="model is DistributedDataParallel \\(ddp\\), not FSDP"):
        train_and_check(ddp, ctx)


def test_a_nan_loss_fails_the_loss_check(ctx):
    model = _lora(ctx)
    with torch.no_grad():
        model.base_model.model.model.embed_tokens.weight.fill_(float("nan"))
    with pytest.raises(CheckFailed, match="loss not finite"):
        train_and_check(wrap(model, "fsdp2", None, ctx), ctx)


def test_synthetic_batch_is_fixed(ctx):
    assert torch.equal(synthetic_batch(ctx), synthetic_batch(ctx))
    assert synthetic_batch(ctx).max() < 128
