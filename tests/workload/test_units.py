"""The structural check (workload/units.py), for real through train_and_check on a 1-rank gloo group: a healthy
FSDP2 and FSDP1 model passes with its summary in ``checks["structure"]``; each broken pattern is caught: tied
parameters split over two ``fully_shard`` groups, a checkpoint wrapper around the wrong module (and checkpointing the
cell never asked for), a buffer left on the meta device, and (on 2 real ranks, scratch_buffers.py) a buffer left
unbroadcast. The first four train without an error and pass every other check; an adapter outside its layer's unit
is reported, not failed (units.py says why)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.corruption import take_reference
from fsdp_matrix.workload.models import build_model, decoder_layers
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import device_mesh, fully_shard, wrap
from tests.workload.support import cpu_context, failed_on_both_ranks, one_rank_group, rank_outcomes, run_two_ranks

FSDP2 = {"wrap": "fsdp2"}


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("units")
    one_rank_group(tmp)
    return cpu_context(tmp)


def _lora(ctx, name="llama"):
    model = add_adapter(build_model(name, "fp32", ctx), "lora", seed=0)
    return model, trainable_names(model), take_reference(model, synthetic_batch(ctx))


def _train(model, ctx, names, reference, params=FSDP2, **kw):
    return train_and_check(model, ctx, trainable=names, reference=reference, params=params, **kw)


def _fsdp2_layers(model, ctx):
    mesh = device_mesh(ctx)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    return mesh


@pytest.mark.parametrize(("how", "orig"), [("fsdp2", None), ("decoder_layer", True), ("peft_policy", False)])
def test_a_healthy_model_passes_with_its_summary(ctx, how, orig):
    # Gemma (tied head) under FSDP2; FSDP1 with use_orig_params=True does not train a PEFT Gemma on torch 2.13
    # (an AssertionError in torch/distributed/utils.py on the tied parameter), so FSDP1 trains Llama
    model, names, reference = _lora(ctx, "gemma" if how == "fsdp2" else "llama")
    params = {"wrap": how, "orig": int(bool(orig))}
    checks = _train(wrap(model, how, orig, ctx), ctx, names, reference, params)
    summary = checks["structure"]
    layer = "GemmaDecoderLayer" if how == "fsdp2" else "LlamaDecoderLayer"
    assert summary["failed"] == 0 and summary["unit_classes"][layer] == 2, summary
    assert summary["units"] == 3 or (how == "peft_policy" and summary["units"] > 3), summary
    assert summary["checkpoint_wrapped"] == summary["checkpoint_flagged"] == []
    assert summary["buffers"] >= 1 and summary["managed"] > 0
    if how == "fsdp2":  # Gemma ties its head to its embedding: one group, kept in one unit
        assert summary["tied"] == [["base_model.model.lm_head.weight", "base_model.model.model.embed_tokens.weight"]]


@pytest.mark.parametrize("head", ["own_group", "root"])
def test_tied_parameters_split_over_two_groups_fail(ctx, monkeypatch, head):
    """fully_shard on Gemma's embedding and on its head gives each its own DTensor: the tie is broken, each copy
    trains alone. ``head="root"`` is accelerate 1.14.0's tail group: ``fully_shard([embed_tokens])``, the head left
    to the root's group (accelerate PR #4171; case accelerate-fsdp2-tied-split). torch >= 2.12 refuses it at lazy
    init (``_validate_no_duplicate_params``); older torch stays silent, so that refusal is lifted here, as older
    torch runs. Every other check passes the model then: the structural line is the only failure."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    if hasattr(FSDPState, "_validate_no_duplicate_params"):
        monkeypatch.setattr(FSDPState, "_validate_no_duplicate_params", lambda self: None)
    model, names, reference = _lora(ctx, "gemma")
    mesh = _fsdp2_layers(model, ctx)
    inner = model.base_model.model
    fully_shard([inner.model.embed_tokens], mesh=mesh)
    if head == "own_group":
        fully_shard(inner.lm_head, mesh=mesh)
    fully_shard(model, mesh=mesh)
    owners = r"\(base_model\.model\.lm_head, " if head == "own_group" else r"\(<root>, "
    with pytest.raises(CheckFailed, match=r"^structure: tied parameters .* are managed by 2 FSDP units " + owners) as e:
        _train(model, ctx, names, reference)
    assert "; " not in str(e.value), str(e.value)


def test_tied_parameters_in_one_group_of_two_modules_pass(ctx):
    """``fully_shard([embed_tokens, lm_head])``: one group over two modules, the tie kept in it (what torch 2.13's
    error prescribes, and accelerate 1.15.0's tail group does, PR #4171). Every module of the group reaches the same
    FSDP state: it is one unit, not two units each managing the tied weight."""
    model, names, reference = _lora(ctx, "gemma")
    mesh = _fsdp2_layers(model, ctx)
    inner = model.base_model.model
    fully_shard([inner.model.embed_tokens, inner.lm_head], mesh=mesh)
    fully_shard(model, mesh=mesh)
    summary = _train(model, ctx, names, reference)["structure"]
    assert summary["failed"] == 0 and summary["units"] == 4, summary
    # Gemma's embedding class is nn.Embedding or, in newer transformers, GemmaTextScaledWordEmbedding
    classes = {("Embedding" if c.endswith("Embedding") else c): n for c, n in summary["unit_classes"].items()}
    assert classes == {"Embedding": 1, "GemmaDecoderLayer": 2, "PeftModelForCausalLM": 1}, summary


def test_an_adapter_outside_its_layers_unit_is_reported(ctx):
    """A module added to layer 0 after its fully_shard, before the root's: no unit manages it (the root's
    fully_shard skips modules inside another unit). Reported, not failed: fix-holds cells have such tensors by
    design (units.py says which)."""
    model, names, _ = _lora(ctx)
    _fsdp2_layers(model, ctx)
    # frozen and in no forward, so that only where it is managed matters (no reference: a forward now would
    # lazily initialize the layers' FSDP state before the root's)
    decoder_layers(model)[0].extra = nn.Linear(4, 4).requires_grad_(False)
    fully_shard(model, mesh=device_mesh(ctx))
    summary = _train(model, ctx, names, None)["structure"]
    assert summary["unmanaged"] == summary["unmanaged_in_units"] == 2 and summary["failed"] == 0, summary


def test_a_checkpoint_wrapper_around_the_wrong_module_fails(ctx):
    model, names, reference = _lora(ctx)
    inner = model.base_model.model.model
    inner.norm = checkpoint_wrapper(inner.norm)  # the final norm, not a decoder layer
    with pytest.raises(CheckFailed, match=r"checkpoint wrappers around modules not decoder layers: .*model\.norm"):
        _train(wrap(model, "fsdp2", None, ctx), ctx, names, reference, {**FSDP2, "gc": "torch_ac"})


def test_checkpointing_the_cell_did_not_ask_for_fails(ctx):
    model, names, reference = _lora(ctx)
    model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with pytest.raises(CheckFailed, match=r"gradient_checkpointing-flagged modules, the cell asked no checkpointing"):
        _train(wrap(model, "fsdp2", None, ctx), ctx, names, reference)


def test_asked_checkpointing_of_the_decoder_layers_passes(ctx):
    model, names, reference = _lora(ctx)
    for layer in decoder_layers(model):
        parent, attr = model.base_model.model.model.layers, str(decoder_layers(model).index(layer))
        parent.register_module(attr, checkpoint_wrapper(layer))
    checks = _train(wrap(model, "fsdp2", None, ctx), ctx, names, reference, {**FSDP2, "gc": "torch_ac"})
    assert len(checks["structure"]["checkpoint_wrapped"]) == 2 and checks["structure"]["failed"] == 0


def test_a_buffer_left_on_meta_fails(ctx):
    model, names, reference = _lora(ctx)
    wrapped = wrap(model, "fsdp2", None, ctx)
    wrapped.base_model.model.register_buffer("scale", torch.empty(3, device="meta"), persistent=False)
    with pytest.raises(CheckFailed, match=r"structure: rank 0 holds 1 buffers on the meta device, e\.g\. .*scale"):
        _train(wrapped, ctx, names, reference)


@pytest.fixture(scope="module")
def buffer_outcomes(tmp_path_factory):
    out = tmp_path_factory.mktemp("buffers")
    proc = run_two_ranks(Path(__file__).with_name("scratch_buffers.py"), str(out))
    return rank_outcomes(proc, out)


@pytest.mark.timeout(600)
def test_a_buffer_left_unbroadcast_fails_on_both_ranks(buffer_outcomes):
    """Real 2 ranks: rank 1's rotary inv_freq differs from rank 0's after wrapping (the healthy control passes)."""
    assert [o["healthy"]["status"] for o in buffer_outcomes] == ["ok", "ok"], buffer_outcomes
    assert buffer_outcomes[0]["healthy"]["structure"]["failed"] == 0
    message = failed_on_both_ranks(buffer_outcomes, "unbroadcast")
    assert "structure: rank 1's buffers differ from rank 0's" in message and "inv_freq" in message, message


def test_a_parameter_two_units_manage_fails():
    """The ownership map alone: FSDP itself refuses to put one name in two units (FSDP1 flattens a parameter once,
    FSDP2 skips parameters another group manages), so no model here builds it; the rule is judged on a map."""
    from fsdp_matrix.workload.units import _owner_failures

    assert _owner_failures({"w": ["a"], "v": ["a"]}, [["v", "w"]]) == []
    (line,) = _owner_failures({"w": ["a", "b"]}, [])
    assert line == "structure: 1 parameters managed by more than one FSDP unit, e.g. w (a, b)"
