"""clip: the one truncation helper; here its head-and-tail mode (what a record keeps of a huge message)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from fsdp_matrix.clip import clip


def test_middle_keeps_head_and_tail_and_says_how_much_went():
    text = "HEAD" + "x" * 1000 + "TAIL"
    out = clip(text, 100, middle=True)
    assert len(out) <= 100 and out.startswith("HEAD") and out.endswith("TAIL")
    left_out = int(re.search(r"\[([\d,]+) characters left out\]", out).group(1).replace(",", ""))
    kept = len(out) - len(re.search(r"….*…", out).group(0))
    assert kept + left_out == len(text)


def test_middle_leaves_short_text_alone():
    assert clip("short", 100, middle=True) == "short"


@given(st.text(max_size=3000), st.integers(min_value=60, max_value=2000))
def test_middle_never_exceeds_its_bound_and_keeps_both_ends(text, chars):
    out = clip(text, chars, middle=True)
    assert len(out) <= chars
    if len(text) <= chars:
        assert out == text
    else:
        assert out.startswith(text[: (chars - 60) // 2]) and out.endswith(text[len(text) - (chars - 60) // 2 :])
