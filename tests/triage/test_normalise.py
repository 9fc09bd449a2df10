"""``triage.normalise``: a rule's message fits the same error with other values, wrapped anywhere, but not another
dtype pair. Synthetic strings and messages of dev pastes only (never the held-out half)."""

import pytest

from fsdp_matrix.triage.match import _pattern, _readings
from fsdp_matrix.triage.normalise import fits, literal, part, reduce

MOE = r"shape '\[4, -1, \d+\]' is invalid for input of size \d+"
SIZE = r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)"
DTYPE = (
    r"(Must flatten tensors with|`?FlatParameter`? requires) uniform dtype but got torch\.(bfloat16|float16) and "
    r"torch\.float32"
)


def _fits(regex: str, message: str) -> bool:
    return fits(_readings(_pattern(regex)), message)


@pytest.mark.parametrize(
    "regex,message",
    [
        (MOE, "shape '[128, -1, 368640]' is invalid for input of size 5898240"),  # other experts, other sizes
        (SIZE, "The size of tensor a (0) must match the size of tensor b (2048) at non-singleton dimension 1"),
        # wrapped by the terminal in the middle of a word, as peft#297's paste is
        (SIZE, "The size of tensor a (0) must match t\nhe size of tensor b (2048) at non-singleton dimension 1"),
        # another spelling of the same dtypes (C++'s names, FSDP1's wording, no backticks)
        (DTYPE, "FlatParameter requires uniform dtype but got BFloat16 and Float"),
    ],
)
def test_the_rule_fits_its_error_with_other_values(regex, message):
    assert _fits(regex, message)


@pytest.mark.parametrize(
    "regex,message",
    [
        # bf16 beside fp16 is LlamaFactory's own casting, not PEFT's fp32 adapters: the dtypes are the failure
        (DTYPE, "Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.float16"),
        (SIZE, "The size of tensor a must be positive"),
        # once the names are gone, "'X' object has no attribute 'y'" is every AttributeError: too little is left
        (r"'Params4bit' object has no attribute 'absmax'", "'NoneType' object has no attribute 'shape'"),
    ],
)
def test_another_error_does_not_fit(regex, message):
    assert not _fits(regex, message)


def test_values_become_placeholders_on_both_sides():
    assert reduce("copying a param with shape torch.Size([0]) from /x/y/model.bin at 0x7f3a") == (
        "copyingaparamwithshapeshapefrompathataddr"
    )
    assert reduce("got torch.bfloat16 and bf16 and c10::BFloat16") == "gotbfloat16andbfloat16andbfloat16"
    # a regex's wildcard is a value, ``.*`` a gap; an escaped parenthesis is a literal one
    assert literal(r"sizes \[\d+, \d+\], .* out of bounds") == "sizes [7, 7], \x00 out of bounds"
    assert _readings(SIZE) == [SIZE]


MIXED = r"got mixed torch\.Tensor and DTensor"


@pytest.mark.parametrize(
    "regex,message,cut",
    [
        # a title that quotes the message without its first word
        (MIXED, "FSDP2 + LoRA results in `mixed torch.Tensor and DTensor`", False),
        # a message cut where the paste ends, in the middle of a word, with other values
        (MOE, "shape '[64, -1, 2048]' is invalid for inp", True),
    ],
)
def test_part_of_the_rule_s_message_fits_a_quote_or_a_cut_paste(regex, message, cut):
    assert not _fits(regex, message)
    assert part(_readings(_pattern(regex)), message, cut)


@pytest.mark.parametrize(
    "regex,message,cut",
    [
        # the same cut message is no fit where the paste goes on after it (it was not cut)
        (MOE, "shape '[64, -1, 2048]' is invalid for inp", False),
        # too little of the rule is left: a cut that keeps its first words only
        (MOE, "shape '[64, -1, 2048]' is in", True),
        (MIXED, "got mixed signals", False),
        # half of a long message is not the message
        (SIZE, "must match the size of tensor b (3)", False),
    ],
)
def test_too_small_a_part_does_not_fit(regex, message, cut):
    assert not part(_readings(_pattern(regex)), message, cut)


def test_a_part_keeps_every_word_with_a_digit():
    # the rule's message without its last word is another dtype pair's too (bf16 beside fp16 is not PEFT's upcast)
    assert not part(_readings(_pattern(DTYPE)), "Must flatten tensors with uniform dtype but got torch.bfloat16 and")
    quoted = "flatten tensors with uniform dtype but got torch.bfloat16 and torch.float32"
    assert part(_readings(_pattern(DTYPE)), quoted)
