"""Checkpoint round-trip checks: the pieces on one rank, and a deliberately wrong save on two ranks for real."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.checkpoint import (
    TOLERANCE,
    Saved,
    adapter_key,
    cell_dir,
    check_restored,
    check_resumed,
    check_saved,
    full_shapes,
    gathered_adapter,
    logits,
    on_every_rank,
    read_adapter_dir,
    read_checkpoint_dir,
    read_dcp,
    reload_and_check,
)
from fsdp_matrix.workload.checkpoint_torch import RAW_PATHS, raw_roundtrip, write_adapter
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import wrap
from tests.workload.support import cpu_context, one_rank_group, rank_outcomes, run_two_ranks

ROOT = Path(__file__).resolve().parents[2]
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("checkpoint")
    one_rank_group(tmp)
    return cpu_context(tmp)


def _peft(ctx, dtype="fp32"):
    return add_adapter(build_model("llama", dtype, ctx), "lora", seed=0, autocast=False if dtype != "fp32" else None)


def _trained(ctx, how="fsdp2", dtype="fp32"):
    model = _peft(ctx, dtype)
    expected = full_shapes(model)
    wrapped = wrap(model, how, None if how == "fsdp2" else True, ctx)
    train_and_check(wrapped, ctx)
    return wrapped, expected


@pytest.mark.parametrize(
    "name",
    [
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",
        "_fsdp_wrapped_module.base_model.model.model.layers.0._fsdp_wrapped_module.self_attn.q_proj.lora_A.default.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
    ],
)
def test_every_spelling_of_an_adapter_tensor_has_one_key(name):
    assert adapter_key(name) == Q_A


def test_full_shapes_are_the_unwrapped_shapes(ctx):
    shapes = full_shapes(_peft(ctx))
    assert len(shapes) == 8 and shapes[Q_A] == (4, 64)
    assert shapes["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"] == (64, 4)


def _saved(tensors, where="f.safetensors"):
    return Saved(where, {k: tuple(v.shape) for k, v in tensors.items()}, dict(tensors))


def test_check_saved_names_a_sliced_tensor_with_both_shapes(ctx):
    trained = {adapter_key(n): p.detach().clone() for n, p in _peft(ctx).named_parameters() if "lora_" in n}
    expected = {k: tuple(v.shape) for k, v in trained.items()}
    sliced = dict(trained, **{Q_A: trained[Q_A][:2]})
    with pytest.raises(CheckFailed, match=rf"adapter tensor {Q_A} saved with shape \[2, 64\], full shape \[4, 64\]"):
        check_saved(_saved(sliced), expected, trained)
    flat = dict(trained, **{Q_A: trained[Q_A].reshape(-1)[:128]})
    with pytest.raises(CheckFailed, match=r"saved with shape \[128\], full shape \[4, 64\]"):
        check_saved(_saved(flat), expected, trained)
    with pytest.raises(CheckFailed, match=r"f.safetensors holds 0/8 adapter tensors"):
        check_saved(_saved({}), expected, trained)
    changed = dict(trained, **{Q_A: trained[Q_A] + 1})
    with pytest.raises(CheckFailed, match=rf"{Q_A} differs from the trained one by max \|diff\| 1"):
        check_saved(_saved(changed), expected, trained)
    half = dict(trained, **{Q_A: trained[Q_A].bfloat16()})
    with pytest.raises(CheckFailed, match="saved as torch.bfloat16, trained in torch.float32"):
        check_saved(_saved(half), expected, trained)
    assert check_saved(_saved(trained), expected, trained)["saved_adapter_tensors"] == 8


# FSDP2 only: at world size 1 FSDP1 falls back to NO_SHARD, whose SHARDED_STATE_DICT misses the root unit's
# parameters (an AssertionError in torch's _state_dict_utils); the FSDP1 paths run on 2 ranks in the matrix
@pytest.mark.parametrize("save,how", [("fsdp2_full", "fsdp2"), ("sharded_dcp", "fsdp2")])
def test_raw_paths_round_trip_on_one_rank(ctx, save, how):
    assert save in RAW_PATHS
    wrapped, expected = _trained(ctx, how)
    with cell_dir(ctx, {"test": save, "wrap": how}) as out:
        builders = (lambda: build_model("llama", "fp32", ctx), lambda: _peft(ctx))
        checks = raw_roundtrip(save, wrapped, ctx, out, builders, expected, torch.float32)
    assert not out.exists()
    assert checks["saved_adapter_tensors"] == 8 and checks["logits_max_diff"] == 0.0
    # the tolerance can tell a trained adapter from an untrained one by far
    assert checks["logits_gap_untrained"] > 100 * TOLERANCE[torch.float32][1]


def test_a_reload_that_loads_nothing_fails(ctx, tmp_path):
    wrapped, expected = _trained(ctx)
    trained, batch = gathered_adapter(wrapped), synthetic_batch(ctx)
    write_adapter(wrapped, trained, tmp_path)
    saved = read_adapter_dir(tmp_path)
    with pytest.raises(CheckFailed, match=r"reloaded model does not hold the trained adapter: 8/8") as err:
        reload_and_check(saved, lambda: _peft(ctx), expected, trained, logits(wrapped, batch), batch, torch.float32)
    assert "reloaded model's logits differ from the FSDP model's" in str(err.value)


def test_bf16_logits_tolerance_covers_peft_upcasting_the_adapter_on_load(ctx, tmp_path):
    wrapped, expected = _trained(ctx, dtype="bf16")
    trained, batch = gathered_adapter(wrapped), synthetic_batch(ctx)
    write_adapter(wrapped, trained, tmp_path)

    def reload():
        return PeftModel.from_pretrained(build_model("llama", "bf16", ctx), str(tmp_path))

    ref = logits(wrapped, batch)
    untrained = logits(_peft(ctx, "bf16"), batch)
    checks = reload_and_check(
        read_adapter_dir(tmp_path), reload, expected, trained, ref, batch, torch.bfloat16, untrained
    )
    # not bit-identical (the reloaded adapter computes in fp32), within the bf16 tolerance, far from untrained
    assert 0 < checks["logits_max_diff"] <= TOLERANCE[torch.bfloat16][1]
    assert checks["logits_gap_untrained"] > 10 * TOLERANCE[torch.bfloat16][1]


def test_dcp_reader_reports_recorded_sizes_and_values(ctx, tmp_path):
    import torch.distributed.checkpoint as dcp

    tensors = {"base_model.model.x.lora_A.default.weight": torch.arange(8.0).reshape(2, 4), "other": torch.ones(3)}
    dcp.save({"model": tensors}, checkpoint_id=str(tmp_path / "ckpt"))
    saved = read_dcp(tmp_path / "ckpt")
    assert saved.shapes == {"base_model.model.x.lora_A.weight": (2, 4)}
    assert torch.equal(
        saved.tensors["base_model.model.x.lora_A.weight"], tensors["base_model.model.x.lora_A.default.weight"]
    )
    assert [s.where for s in read_checkpoint_dir(tmp_path)] == []  # "ckpt" is not a model file name
    (tmp_path / "ckpt").rename(tmp_path / "pytorch_model_fsdp_0")
    assert [s.where for s in read_checkpoint_dir(tmp_path)] == ["DCP checkpoint pytorch_model_fsdp_0/"]


def test_check_resumed_tells_a_restart_from_init_apart():
    start = {"a.lora_A.weight": torch.zeros(2, 2)}
    done = {"a.lora_A.weight": torch.full((2, 2), 0.03)}
    assert check_resumed(done, done, start, torch.float32)["resume_max_diff"] == 0.0
    with pytest.raises(CheckFailed, match=r"1/1 adapter tensors differ .*max \|diff\| 0.03 .*\(still its init value\)"):
        check_resumed(start, done, start, torch.float32)
    with pytest.raises(CheckFailed, match="missing after the resume"):
        check_resumed({}, done, start, torch.float32)


def test_check_restored_names_model_and_optimizer():
    at_save = {"a.lora_A.weight": torch.ones(2)}
    assert check_restored(at_save, at_save, ([1.0, 2.0, 4.0], [1.0, 2.0, 4.0]))
    with pytest.raises(CheckFailed, match=r"did not restore the model: 1/1 .*did not restore the optimizer state"):
        check_restored({"a.lora_A.weight": torch.zeros(2)}, at_save, ([1.0, 2.0, 4.0], [0.0, 0.0, 0.0]))


def test_on_every_rank_passes_results_and_errors_through(ctx):
    assert on_every_rank(lambda: 3) == 3
    with pytest.raises(KeyError):
        on_every_rank(lambda: {}["x"])


@pytest.mark.timeout(600)
def test_saving_only_rank0s_shard_is_caught_naming_tensor_and_shapes(tmp_path):
    """For real on 2 ranks (gloo): FSDP2-trained LoRA, one save with only rank 0's local shard of each tensor,
    one with full tensors. The first fails on every rank naming the tensor and both shapes; the second passes."""
    proc = run_two_ranks(ROOT / "tests" / "workload" / "scratch_rank0_shard.py", str(tmp_path))
    for outcome in rank_outcomes(proc, tmp_path):
        assert outcome["full"] == {"status": "ok"}
        wrong = outcome["rank0_shard"]
        assert wrong["status"] == "CheckFailed"
        assert "adapter_model.safetensors: 8/8 wrong shapes" in wrong["message"]
        assert f"adapter tensor {Q_A} saved with shape [2, 64], full shape [4, 64]" in wrong["message"]
        lora_b = Q_A.replace("lora_A", "lora_B")
        assert f"adapter tensor {lora_b} saved with shape [32, 4], full shape [64, 4]" in wrong["message"]
