"""The dtype promise check (workload/dtypes.py), for real through train_and_check on a 1-rank gloo group: healthy
cells pass with ``checks["dtypes"]``; each broken promise is caught: trainable parameters left bf16 where the entry
promises fp32 master weights (accelerate's FSDP2 with bf16 mixed precision, issue 39), a frozen parameter out of its
load dtype, gradients kept in another dtype than their parameter's, optimizer state in another dtype, and a layer
computing outside the FSDP mixed-precision dtype. Each trains without an error, and every other check passes it."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.corruption import take_reference
from fsdp_matrix.workload.models import build_model, decoder_layers
from fsdp_matrix.workload.training import LR, synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import decoder_layer_policy, device_mesh, fully_shard
from tests.workload.support import cpu_context, one_rank_group, rank_outcomes, run_two_ranks

try:
    from torch.distributed.fsdp import MixedPrecisionPolicy
except ImportError:  # torch < 2.6
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy

FSDP2 = {"wrap": "fsdp2"}


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dtypes")
    one_rank_group(tmp)
    return cpu_context(tmp)


def _lora(ctx, dtype="fp32", autocast=True):
    model = add_adapter(build_model("llama", dtype, ctx), "lora", seed=0, autocast=autocast)
    return model, trainable_names(model), take_reference(model, synthetic_batch(ctx))


def _fsdp2(model, ctx, policy=None):
    mesh = device_mesh(ctx)
    kw = {} if policy is None else {"mp_policy": policy}
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    return model


BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def test_fsdp2_with_fp32_masters_passes(ctx):
    """What accelerate's FSDP2 does under bf16 mixed precision: trainable bf16 parameters upcast to fp32 before
    fully_shard, bf16 compute through the policy."""
    model, names, reference = _lora(ctx, "bf16", autocast=False)
    for param in model.parameters():
        if param.requires_grad:
            param.data = param.data.float()
    checks = train_and_check(
        _fsdp2(model, ctx, BF16),
        ctx,
        trainable=names,
        reference=reference,
        params=FSDP2,
        entry={"mixed_precision": "bf16"},
    )
    assert checks["dtypes"]["trainable"] == {"float32": len(names)}, checks["dtypes"]
    assert checks["dtypes"]["setting"] == "accelerate:bf16" and checks["dtypes"]["compute"] == "bfloat16"
    assert checks["dtypes"]["compute_checked"] > 0 and checks["dtypes"]["optimizer_state"] == 2 * len(names)
    assert checks["grad_dtypes"] == ["float32"]


def test_trainable_left_bf16_under_promised_fp32_masters_fails(ctx):
    """accelerate's FSDP2 with bf16 mixed precision says it upcasts the trainable parameters to fp32; left bf16,
    everything trains (issue 39: only a check inside one repro caught it)."""
    model, names, reference = _lora(ctx, "bf16", autocast=False)
    wrapped = _fsdp2(model, ctx, BF16)
    with pytest.raises(CheckFailed, match=r"dtypes: 8 trainable parameters not in their promised dtype \(fp32 masters"):
        train_and_check(
            wrapped, ctx, trainable=names, reference=reference, params=FSDP2, entry={"mixed_precision": "bf16"}
        )


def test_a_frozen_parameter_out_of_its_load_dtype_fails(ctx):
    model, names, reference = _lora(ctx)
    # narrower than loaded: the sharding check only refuses wider
    model.base_model.model.model.embed_tokens.to(torch.bfloat16)
    model.base_model.model.model.embed_tokens.register_forward_hook(lambda m, a, out: out.float())
    with pytest.raises(CheckFailed, match=r"dtypes: 1 frozen parameters .*embed_tokens\.weight is bfloat16, promised"):
        train_and_check(_fsdp2(model, ctx), ctx, trainable=names, reference=reference, params=FSDP2)


def test_gradients_kept_in_low_precision_fail(ctx):
    """FSDP1 ``keep_low_precision_grads``: the fp32 parameters' gradients stay bf16 into the optimizer step. AdamW
    refuses them (a RuntimeError in its lerp); SGD applies them without a word."""
    model, names, reference = _lora(ctx)
    policy = MixedPrecision(param_dtype=torch.bfloat16, keep_low_precision_grads=True)
    wrapped = FullyShardedDataParallel(
        model,
        auto_wrap_policy=decoder_layer_policy(model),
        use_orig_params=True,
        mixed_precision=policy,
        device_id=ctx.device,
    )
    with pytest.raises(CheckFailed, match=r"dtypes: \d+ gradients not in their parameter's dtype"):
        sgd = torch.optim.SGD([p for p in wrapped.parameters() if p.requires_grad], lr=LR)
        train_and_check(
            wrapped, ctx, trainable=names, optimizer=sgd, reference=reference, params={"wrap": "decoder_layer"}
        )


def test_optimizer_state_in_another_dtype_fails(ctx):
    model, names, reference = _lora(ctx)
    wrapped = _fsdp2(model, ctx)
    optimizer = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=LR)

    steps = [0]

    def to_bf16(opt, *_):  # after the last step: a bf16 moment inside a step is another error
        steps[0] += 1
        for state in opt.state.values() if steps[0] == 2 else ():
            state["exp_avg_sq"] = state["exp_avg_sq"].to(torch.bfloat16)

    optimizer.register_step_post_hook(to_bf16)
    with pytest.raises(CheckFailed, match=r"optimizer state tensors not in their parameter's dtype: exp_avg_sq bfl"):
        train_and_check(wrapped, ctx, steps=2, trainable=names, optimizer=optimizer, reference=reference, params=FSDP2)


def test_a_layer_computing_outside_the_mixed_precision_dtype_fails(ctx):
    """The FSDP2 policy promises bf16 compute; layer 0's MLP is its own group without the policy and casts its input
    up to fp32 (its parameters stay fp32): it computes in fp32."""
    model, names, reference = _lora(ctx)
    mesh = device_mesh(ctx)
    mlp = decoder_layers(model)[0].mlp
    fully_shard(mlp, mesh=mesh)
    mlp.register_forward_pre_hook(lambda m, args: tuple(a.float() for a in args))
    mlp.register_forward_hook(lambda m, a, out: out.to(torch.bfloat16))
    wrapped = _fsdp2(model, ctx, BF16)
    with pytest.raises(CheckFailed, match=r"base linear layers computed in another dtype than bfloat16 .*mlp"):
        train_and_check(wrapped, ctx, trainable=names, reference=reference, params=FSDP2)


def test_check_optimizer_counts_adamw_moments():
    from fsdp_matrix.workload.dtypes import check_optimizer

    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([param])
    param.grad = torch.ones(3)
    optimizer.step()
    assert check_optimizer(optimizer) == ({"optimizer_state": 2, "optimizer_state_wrong": 0}, [])


def test_accelerate_promises_no_upcast_for_a_4bit_fsdp2_model():
    """accelerate 1.15.0's fsdp2_prepare_model skips its upcast where the model has Params4bit (and says nothing):
    the TRL QLoRA FSDP2 cells (trl-qlora-upcast, storage bf16) keep bf16 LoRA, and no fp32 master is promised there.
    FSDP1 upcasts every FlatParameter that requires grad, 4-bit or not."""
    from fsdp_matrix.workload.dtypes import dtype_promise_of, expected

    load = {"w": ((2,), torch.bfloat16)}
    assert expected(dtype_promise_of(load, "bf16", None, fsdp2_4bit=True), "w", True) == torch.bfloat16
    assert expected(dtype_promise_of(load, "bf16", None, upcasts=True), "w", True) == torch.float32
    # accelerate < 0.30 (before PR #2674) has no upcast: bf16 stays bf16, as observed on peft0.10-tf4.40
    assert expected(dtype_promise_of(load, "bf16", None, upcasts=False), "w", True) == torch.bfloat16
    setting = dtype_promise_of(load, "bf16", None, upcasts=False).setting
    assert setting == "accelerate:bf16 (accelerate < 0.30: no upcast)"
    assert expected(dtype_promise_of(load, "bf16", None), "w", False) == torch.bfloat16
    assert expected(dtype_promise_of(load, "no", torch.bfloat16), "w", True) == torch.bfloat16


@pytest.mark.current_combo  # skipped in the old combo (no FSDP2 in accelerate 1.1.1): nox -s 'tests(current)' runs it
@pytest.mark.timeout(600)
def test_accelerate_fsdp2_bf16_keeps_its_fp32_master_promise(tmp_path):
    """For real on 2 ranks through the accelerate entry (scratch_accelerate_mp.py): the installed accelerate's FSDP2
    with bf16 mixed precision. 1.13.0 leaves the trainable parameters bf16 while its log line says it upcast them
    (accelerate#3979): the dtype check alone fails it (observed 2026-11-28, accelerate 1.13.0 over the current combo:
    no other check failed). 1.14.0 and 1.15.0 keep the promise."""
    import accelerate
    from accelerate.utils import FullyShardedDataParallelPlugin

    if "fsdp_version" not in inspect.signature(FullyShardedDataParallelPlugin).parameters:
        pytest.skip(f"accelerate {accelerate.__version__} has no FSDP2")
    proc = run_two_ranks(Path(__file__).with_name("scratch_accelerate_mp.py"), str(tmp_path), "full")
    got = [outcome["full"] for outcome in rank_outcomes(proc, tmp_path)]
    if accelerate.__version__ == "1.13.0":
        assert [g["status"] for g in got] == ["CheckFailed"] * 2, got
        assert got[0]["message"].startswith("dtypes: 8 trainable parameters not in their promised dtype"), got
        assert "; " not in got[0]["message"], got  # no other check failed
    else:
        assert [g["status"] for g in got] == ["ok", "ok"], got
        assert got[0]["dtypes"]["trainable"] == {"float32": 8}, got
