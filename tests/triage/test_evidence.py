"""``triage.evidence``: what a paste shows besides its message."""

import pytest

from fsdp_matrix.triage.evidence import from_pretrained_init, read_context
from fsdp_matrix.triage.parse import parse


@pytest.mark.parametrize(
    "text,peft",
    [
        ("PEFT version: 0.15.0\nDeepSpeed version: 0.15.4\n", False),  # an environment listing, no adapter
        ("peft==0.3.0\n", False),
        ("FSDP2训练LoRA报错\n", True),  # CJK around LoRA: still the word
        ("model = get_peft_model(model, config)\n", True),
        ("self._is_lora = True\n", False),
    ],
)
def test_peft_evidence_is_an_adapter_not_an_installed_package(text, peft):
    assert bool(read_context(parse(text)).peft) is peft


@pytest.mark.parametrize(
    "text,elsewhere",
    [
        ("DeepSpeed ZeRO-3 throws RuntimeError\n", ["deepspeed"]),
        ("- DeepSpeed version: 0.15.4\n- Accelerate version: 1.5.2\n", []),
        ("when using LoRA + fsdp2 Context Parallel\n", ["context-parallel"]),
        ('  File "/x/site-packages/megatron/core/optimizer.py", line 3, in step\n', ["megatron"]),
    ],
)
def test_other_stacks_are_read_from_words_and_frames(text, elsewhere):
    assert [name for name, _ in read_context(parse(text)).elsewhere] == elsewhere


def test_a_model_s_own_init_under_from_pretrained():
    text = (
        '  File "/x/site-packages/transformers/modeling_utils.py", line 3, in from_pretrained\n'
        "    model = cls(config)\n"
        '  File "/x/site-packages/transformers/models/llama/modeling_llama.py", line 9, in __init__\n'
        "    self.scale = x.item()\n"
        "RuntimeError: Tensor.item() cannot be called on meta tensors\n"
    )
    assert from_pretrained_init(parse(text)) == "transformers.models.llama.modeling_llama"
    assert from_pretrained_init(parse(text.replace("in from_pretrained", "in resize_token_embeddings"))) is None
