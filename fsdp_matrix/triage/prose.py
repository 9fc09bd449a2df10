"""A report in words (an issue's title, a PR's description, a sentence that describes the error without its
message) names a case by the settings, entries and library paths the case's title names: ``use_orig_params``,
``get_peft_model``, ``merge_and_unload``, ``generate()``, ``target_parameters``, ``DoRA``.

Words are weaker evidence than a message: a claim from them is ``weak`` at most, and is made only when nothing else is
claimed, when the paste shows FSDP and a PEFT adapter and no other stack, when no exception line of it is another
error, and when one case is named by more of its words than any other.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional, Sequence, Tuple

from fsdp_matrix.triage import normalise

_TERM = re.compile(
    r"[A-Za-z_][\w.]*\(\)|\b\w+_\w+\b|\b[A-Za-z]*[a-z][A-Z]\w*|\b[A-Z][A-Z0-9]{1,}\w*|\b(?:bfloat16|float16|float32)\b"
)
"""Code-like words of a title: a call (``generate()``), a snake_case setting, a CamelCase name, an acronym, a dtype
(in one spelling: ``normalise.dtypes``)."""
_DTYPE_WORDS = frozenset({"bfloat16", "float16", "float32"})
_CLASS_SUFFIX = re.compile(r"(error|exception|warning)$")
"""A class name's last word, which a report may write apart (``AssertionError`` as "assertion error")."""
STOP = frozenset(
    {"fsdp", "fsdp1", "fsdp2", "lora", "peft", "cpu", "cuda", "valueerror", "userwarning", "nan", "lora_a"}
)
"""Words every PEFT x FSDP report says (the matrix's own subject) or that name no setting."""
COMMON = 0.25
"""A word in more than this share of the cases' titles tells no case apart."""
LEAST = 2
"""Evidence a case needs from a report's words: two of its words, or one and its message (a rule that fit but was not
claimed alone, e.g. a message any library raises)."""


@dataclass(frozen=True)
class Named:
    """A case a report names in words."""

    case: str
    """The case id."""
    words: Tuple[str, ...]
    """The case's words the report holds, as the title spells them."""
    message: bool
    """Whether one of the case's rule messages is in the report too."""

    @property
    def score(self) -> int:
        return len(self.words) + int(self.message)


def terms(title: str) -> FrozenSet[str]:
    """The code-like words of a case's title, lower-cased."""
    return frozenset(t.strip(".").lower() for t in _TERM.findall(normalise.dtypes(title))) - STOP


@functools.lru_cache(maxsize=8)
def _distinct(titles: Tuple[Tuple[str, str], ...]) -> Dict[str, FrozenSet[str]]:
    counts: Dict[str, int] = {}
    for _, title in titles:
        for term in terms(title):
            counts[term] = counts.get(term, 0) + 1
    most = max(1, int(COMMON * len(titles)))
    return {case: frozenset(t for t in terms(title) if counts[t] <= most) for case, title in titles}


_PATH = re.compile(r"[^\s\"'`\[(]*[/\\][^\s\"'`]*?\.py\b\S*")
"""A file's path (a frame's): its folders name the libraries the run imports (``site-packages/trl/...``), not what
the report says."""


def _holds(text: str, term: str) -> bool:
    word = _CLASS_SUFFIX.sub(r"[\\s_-]?\1", re.escape(term.rstrip("()")))
    return bool(re.search(rf"(?<![A-Za-z0-9_]){word}(?![A-Za-z0-9_])", text, re.IGNORECASE))


def held(titles: Sequence[Tuple[str, str]], text: str, dtypes: bool = True) -> Dict[str, Tuple[str, ...]]:
    """Case id -> the words of its title (those that tell cases apart) the report holds; cases it holds none of are
    left out. ``titles`` is (case id, title) for every case; without ``dtypes``, a dtype is no word (a title that
    quotes a message holds the message's dtypes)."""
    text = normalise.dtypes(_PATH.sub(" ", text))
    out = {}
    for case, words in _distinct(tuple(titles)).items():
        found = tuple(sorted(t for t in words if (dtypes or t not in _DTYPE_WORDS) and _holds(text, t)))
        if found:
            out[case] = found
    return out


def named(titles: Sequence[Tuple[str, str]], text: str, messages: FrozenSet[str] = frozenset()) -> Optional[Named]:
    """The one case the report's words name best, with ``LEAST`` evidence and ahead of every other; None otherwise.
    ``titles`` is (case id, title) for every case; ``messages`` the cases whose rule message is in the report."""
    found = [Named(case, words, case in messages) for case, words in held(titles, text).items()]
    found.sort(key=lambda n: -n.score)
    if not found or found[0].score < LEAST or (len(found) > 1 and found[1].score >= found[0].score):
        return None
    return found[0]
