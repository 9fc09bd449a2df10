"""A message with its values taken out, so that a rule written from one report fits the same error with other values.

A rule's regex is written from the message of one run: ``shape '[4, -1, 4096]' is invalid``, a path, a parameter's
name, a size. Another user's run of the same failure has other numbers, shapes, names and paths, and the paste may
wrap the message in the middle of a word (``must match t`` / ``he size``). Both sides are reduced to one form before
they are compared:

- numbers, shapes (``torch.Size([2, 3])``, ``[128, -1, 368640]``, ``(20x896)``), quoted names (``'absmax'``,
  ```lm_head```), paths and addresses become placeholders;
- dtypes keep which dtype they are, in one spelling (``BFloat16``, ``bf16``, ``c10::BFloat16`` -> ``bfloat16``):
  the pair of dtypes is the failure itself (``bfloat16 and float32`` is PEFT's fp32 adapters beside a bf16 base,
  ``bfloat16 and float16`` is not; tests/fixtures/triage/corpus/llamafactory3853_bf16_fp16.txt);
- whitespace and case go, so a line broken anywhere, even inside a word, reads as the unbroken one.

On the rule's side, a regex's wildcards (``\\d+``, ``\\S+``, ``.*``) become a value or a gap, and each reading of its
``(a|b)`` groups is compared on its own (``match._readings``).
"""

from __future__ import annotations

import functools
import re
from typing import List, Optional

_DTYPES = (
    (re.compile(r"\b(?:torch\.|c10::)?(?:bfloat16|BFloat16|bf16)\b"), "bfloat16"),
    (re.compile(r"\b(?:torch\.|c10::)?(?:float16|Half|fp16)\b"), "float16"),
    (re.compile(r"\b(?:torch\.|c10::)?(?:float32|Float|fp32)\b"), "float32"),
    (re.compile(r"\b(?:torch\.|c10::)?(?:float64|Double)\b"), "float64"),
    (re.compile(r"\b(?:torch\.|c10::)?(?:uint8|Byte)\b"), "uint8"),
)
"""Spellings of one dtype across torch's messages (``torch.bfloat16``, C++'s ``BFloat16``, configs' ``bf16``)."""
_VALUES = (
    (re.compile(r"0x[0-9a-fA-F]+"), " ADDR "),
    (re.compile(r"(?:[A-Za-z]:)?(?:[\w.~-]*[/\\])+[\w.-]+\.\w+"), " PATH "),
    (re.compile(r"torch\.Size\(\[[^\]]*\]\)"), " SHAPE "),
    (re.compile(r"\[\s*-?\d+(?:\s*,\s*-?\d+)*\s*,?\s*\]"), " SHAPE "),
    (re.compile(r"\b\d+(?:x\d+)+\b"), " SHAPE "),
    (re.compile(r"'[^'\s]{1,120}'|\"[^\"\s]{1,120}\""), " NAME "),
    (re.compile(r"-?\b\d+(?:\.\d+)?(?:e-?\d+)?\b"), " NUM "),
)
"""Values of a message, most specific first: an address, a path, a shape, a quoted name, a number."""
GAP = "\x00"
"""Where the rule's regex allows anything (``.*``): its pieces must come in order, anything between them."""
MIN_CHARS = 24
"""Letters a rule's reduced form must keep besides its placeholders: ``'X' object has no attribute 'y'`` keeps 20,
which any AttributeError has, and is not compared once its values are gone."""
_PLACEHOLDERS = re.compile(r"addr|path|shape|name|num")


def dtypes(text: str) -> str:
    """``text`` with each dtype in one spelling (``bf16``, ``BFloat16``, ``torch.bfloat16`` -> ``bfloat16``)."""
    for pattern, name in _DTYPES:
        text = pattern.sub(name, text)
    return text


@functools.lru_cache(maxsize=4096)
def reduce(text: str) -> str:
    """``text`` with its values as placeholders, one spelling per dtype, no whitespace, lower-cased; the gap marker of
    a rule's literal kept."""
    # backticks go, as ``match._plain`` drops them: some releases quote a name with them, others do not
    text = dtypes(text.replace("`", ""))
    for pattern, placeholder in _VALUES:
        text = pattern.sub(placeholder, text)
    return re.sub(r"\s+", "", text).lower()


_REGEX_VALUE = re.compile(r"\\[dw]\+?|\\S\+?|(?<!\\)\[\^?[^\]]*\][+*]?")
_REGEX_GAP = re.compile(r"\.[*+]\??")


def literal(reading: str) -> Optional[str]:
    """One reading of a rule's regex (no ``(a|b)`` groups left) as the message it stands for: ``\\d+`` a number,
    ``\\S+`` a name, ``.*`` a gap; None when it still holds regex syntax this cannot read."""
    text = _REGEX_VALUE.sub("7", _REGEX_GAP.sub(GAP, reading))
    if re.search(r"(?<!\\)[()|{}^$*+?\[\]]", text):
        return None
    return re.sub(r"\\(.)", r"\1", text)


def fits(readings: List[str], message: str) -> bool:
    """Whether one reading of the rule, its values and whitespace reduced, is in the message reduced the same way."""
    mine = reduce(message)
    for reading in readings:
        text = literal(reading)
        if text is None:
            continue
        pieces = [p for p in reduce(text).split(GAP) if p]
        if sum(len(_PLACEHOLDERS.sub("", p)) for p in pieces) < MIN_CHARS:
            continue
        at = 0
        for piece in pieces:
            at = mine.find(piece, at)
            if at < 0:
                break
            at += len(piece)
        else:
            return True
    return False


QUOTED = 0.85
"""The share of a rule's letters (placeholders aside) that a run of its words, its first or last words left out, must
keep to stand for it: a title quotes a message without its lead word (``mixed torch.Tensor and DTensor``)."""
CUT = 0.5
"""The share of a rule's letters a message cut where the paste ends (a stored excerpt, a truncated log) must keep:
what is left is a prefix of the rule, cut anywhere, even inside a word."""


def _letters(reduced: str) -> int:
    return len(_PLACEHOLDERS.sub("", reduced))


def _runs(words: List[str], least: float) -> List[str]:
    """The reduced runs of ``words`` without some of their first or last words that keep ``least`` of its letters;
    a word with a digit (a dtype, a size) is never left out, for ``bfloat16 and float16`` is not ``bfloat16 and
    float32``."""
    total = _letters(reduce(" ".join(words)))
    kept = [i for i, w in enumerate(words) if any(c.isdigit() for c in w)]
    first, last = (min(kept), max(kept)) if kept else (len(words), -1)
    runs = [reduce(" ".join(words[i:])) for i in range(1, min(first, len(words) - 1) + 1)]
    runs += [reduce(" ".join(words[:j])) for j in range(len(words) - 1, max(last, 0), -1)]
    return [r for r in runs if _letters(r) >= least * total]


def part(readings: List[str], message: str, cut: bool = False) -> bool:
    """Whether the message holds most of one reading of the rule (``QUOTED``, its first or last words left out), or,
    when the message is ``cut`` where the paste ends, ends with a prefix of it (``CUT``). Values are reduced as in
    ``fits``; a rule with a gap (``.*``) is not read in part."""
    mine = reduce(message)
    for reading in readings:
        text = literal(reading)
        if text is None or GAP in text:
            continue
        whole = reduce(text)
        total = _letters(whole)
        if total < MIN_CHARS:
            continue
        if any(_letters(run) >= MIN_CHARS and run in mine for run in _runs(text.split(), QUOTED)):
            return True
        prefixes = (whole[:k] for k in range(len(whole), 0, -1) if _letters(whole[:k]) >= CUT * total)
        if cut and any(mine.endswith(prefix) for prefix in prefixes):
            return True
    return False
