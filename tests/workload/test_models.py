from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from packaging.version import Version

from fsdp_matrix.workload import models
from fsdp_matrix.workload.models import (
    build_4bit_model,
    build_model,
    count_linear4bit,
    decoder_layer_class,
    decoder_layers,
)
from tests.workload.support import cpu_context


@pytest.mark.parametrize("name", ["llama", "gemma"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_build_model_dtype_and_identical_init(tmp_path, name, dtype):
    ctx = cpu_context(tmp_path)
    a, b = build_model(name, dtype, ctx), build_model(name, dtype, ctx)
    want = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    assert {p.dtype for p in a.parameters()} == {want}
    # every rank builds its own copy: the same seed must give the same weights, or FSDP would shard mismatched halves
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb)
    assert sum(p.numel() for p in a.parameters()) < 200_000


def test_seed_changes_weights(tmp_path):
    a = build_model("llama", "fp32", cpu_context(tmp_path, seed=0))
    b = build_model("llama", "fp32", cpu_context(tmp_path, seed=1))
    assert not torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)


@pytest.mark.parametrize("name,cls", [("llama", "LlamaDecoderLayer"), ("gemma", "GemmaDecoderLayer")])
def test_decoder_layers(tmp_path, name, cls):
    model = build_model(name, "fp32", cpu_context(tmp_path))
    assert decoder_layer_class(model).__name__ == cls
    assert len(decoder_layers(model)) == 2


def test_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="unknown model"):
        build_model("gpt9", "fp32", cpu_context(tmp_path))
    with pytest.raises(ValueError, match="unknown dtype"):
        build_model("llama", "fp8", cpu_context(tmp_path))


# the same limit as matrix.yaml's skip rule: observed 'No GPU found' / frozenset AttributeError / 'None of the
# available devices' up to 4.51.3, a working CPU 4-bit load from 4.56.2 on
CPU_4BIT = Version(transformers.__version__) >= Version("4.56")


@pytest.mark.skipif(not CPU_4BIT, reason="this transformers refuses bitsandbytes 4-bit on a CPU-only machine")
@pytest.mark.parametrize("storage,want", [("uint8", torch.uint8), ("bf16", torch.bfloat16)])
def test_4bit_model_holds_linear4bit_in_the_storage_dtype(tmp_path, storage, want):
    model = build_4bit_model("llama", "bf16", storage, cpu_context(tmp_path))
    assert count_linear4bit(model) == 14  # 7 projections x 2 layers
    q = model.model.layers[0].self_attn.q_proj.weight
    assert type(q).__name__ == "Params4bit" and q.dtype == want
    out = model(input_ids=torch.zeros(1, 4, dtype=torch.long)).logits
    assert torch.isfinite(out).all()


class _Loaded(Exception):
    """Stands in for the 4-bit load (not every env can load 4-bit on a CPU): what it was given is the test's."""


def test_a_save_that_failed_half_way_is_not_reused_by_the_next_build(tmp_path, monkeypatch):
    """A saver writes config.json first; a save that failed after it must not pass for a complete
    model in the next cell's build, which must save again and load only a whole save."""
    cls = transformers.LlamaForCausalLM
    real_save, saves = models.save_model_files, []

    def half_save(model, path):
        saves.append(path)
        model.config.save_pretrained(path)  # what a save writes first
        raise OSError(28, "No space left on device")

    def load(path, *args, **kwargs):
        raise _Loaded(sorted(p.name for p in Path(path).iterdir()))

    monkeypatch.setattr(cls, "from_pretrained", staticmethod(load))
    monkeypatch.setattr(models, "save_model_files", half_save)
    with pytest.raises(OSError, match="No space left"):
        build_4bit_model("llama", "bf16", "uint8", cpu_context(tmp_path))
    assert not list(tmp_path.iterdir())  # nothing of the failed save is left where a build would look
    monkeypatch.setattr(models, "save_model_files", lambda model, path: saves.append(path) or real_save(model, path))
    with pytest.raises(_Loaded) as loaded:
        build_4bit_model("llama", "bf16", "uint8", cpu_context(tmp_path))
    assert len(saves) == 2  # saved again, not taken from the half-written directory
    assert "config.json" in loaded.value.args[0] and "model.safetensors" in loaded.value.args[0]
    with pytest.raises(_Loaded):
        build_4bit_model("llama", "bf16", "uint8", cpu_context(tmp_path))
    assert len(saves) == 2  # a whole save is reused


@pytest.mark.parametrize("name", ["llama", "gemma"])
def test_saved_files_load_back_as_save_pretrained_would(tmp_path, name):
    # a tied pair stored under lm_head.weight (safetensors' save_model picks that name) left Gemma's embed_tokens on
    # the meta device in transformers 4.57.6's from_pretrained: every launcher cell then trained on garbage
    model = build_model(name, "fp32", cpu_context(tmp_path))
    models.save_model_files(model, tmp_path / "saved")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "saved" / "model.safetensors"), "pt") as saved:
        keys = set(saved.keys())
    assert "model.embed_tokens.weight" in keys
    assert ("lm_head.weight" in keys) == (not model.config.tie_word_embeddings)
    _, cls = models._config(name)
    loaded = cls.from_pretrained(tmp_path / "saved")
    for (n, want), (m, got) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert n == m and got.device.type == "cpu" and torch.equal(got, want), n
