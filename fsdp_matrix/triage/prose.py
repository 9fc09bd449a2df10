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
from typing import Callable, Dict, FrozenSet, Optional, Sequence, Tuple

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
    {
        "fsdp",
        "fsdp1",
        "fsdp2",
        "lora",
        "peft",
        "cpu",
        "cuda",
        "valueerror",
        "userwarning",
        "nan",
        "lora_a",
        "peft_config",
    }
)
"""Words every PEFT x FSDP report says (the matrix's own subject) or that name no setting: ``peft_config`` is how
every TRL report hands its adapter over (trl-qlora-upcast's ``trainer`` axis names it as the trainers' argument)."""
COMMON = 0.25
"""A word in more than this share of the cases' titles tells no case apart."""
PAIR_COMMON = 0.1
"""A phrase (``phrases``) in more than this share of the cases' titles tells no case apart: plain words recur more
than code-like ones ("mixed precision" is in six titles)."""
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
    tied: Tuple[str, ...] = ()
    """Cases the words name as much, each the same failure (they expect the same error)."""
    called: int = 0
    """How many of ``words`` are calls the title writes as calls (``disable_adapter()``) and the report makes
    (``model.disable_adapter()``): each counts twice (``calls``)."""

    @property
    def score(self) -> int:
        return len(self.words) + int(self.message) + self.called


def terms(title: str) -> FrozenSet[str]:
    """The code-like words of a case's title, lower-cased."""
    return frozenset(t.strip(".").lower() for t in _TERM.findall(normalise.dtypes(title))) - STOP


def setting_names(meaning: str) -> FrozenSet[str]:
    """The settings an axis's ``meaning`` names as what the axis is: the snake_case names of its head (before the
    list of its values, ``: `` or `` (``), lower-cased; ``bitsandbytes 4-bit quant_storage dtype``), not the call or
    object a setting belongs to (``get_peft_model's autocast_adapter_dtype``: its owner, which many cases share)."""
    head = re.split(r": | \(", meaning, maxsplit=1)[0]
    head = re.sub(r"\S+'s?(?=\s)", " ", head)
    return frozenset(t for t in terms(head) if "_" in t and not t.endswith("()"))


_SYNONYMS = (
    (re.compile(r"\bgrad(?:ient)?[\s_-]*checkpoint", re.IGNORECASE), "gradient checkpoint"),
    (re.compile(r"\brequires?[\s_-]*grads?\b", re.IGNORECASE), "require grad"),
)
"""One spelling for what reports write many ways: ``gradient_checkpointing_enable()``, "grad checkpointing";
``requires_grad``, ``require_grads``, "does not require grad"."""
_FILLER = frozenset(
    "a an the of to in on at by for from with and or as is are be been was were it its this that these those do does "
    "did not no get gets getting use used uses using when if then than so but model models has have having will can "
    "which who what all each every one two under over via through into onto while there their them they we i my our "
    "you error errors raise raised raises fail fails failed failing issue bug problem work works working".split()
)
"""Words a phrase is read across: "turned on after PEFT" and "enabled after PeftModel is created" both hold
``after peft``; and what every report says ("error raised", "training fails"), which names no case."""


def _stem(word: str) -> str:
    for suffix, least in (("ing", 6), ("ed", 5), ("s", 4)):
        if len(word) >= least and word.endswith(suffix) and not word.endswith("ss"):
            return word[: -len(suffix)]
    return word


def phrases(text: str) -> FrozenSet[str]:
    """The text's pairs of neighbouring words (filler left out, each word stemmed, snake_case and CamelCase split,
    never across punctuation): a title's "gradient checkpointing turned on after PEFT" and a report's
    "gradient_checkpointing_enable() ... after get_peft_model" share ``gradient checkpoint`` and ``after peft``."""
    for pattern, spelling in _SYNONYMS:
        text = pattern.sub(spelling, text)
    # PeftModel is "peft model"; LoRA, QLoRA, DTensor stay whole
    text = re.sub(r"([a-z])([A-Z][a-z])", r"\1 \2", text).replace("_", " ")
    out = set()
    for piece in re.split(r"[^A-Za-z0-9 \t'/-]+|\s[/-]\s", text):
        # a pair reads across one filler word ("turned on after"), not a clause ("fp32 with the trainable ones")
        words, gap = [], 0
        for word in re.findall(r"[a-z][a-z0-9]+", piece.lower()):
            if word in _FILLER:
                gap += 1
                continue
            words += [None, _stem(word)] if gap > 1 else [_stem(word)]
            gap = 0
        pairs = [(a, b) for a, b in zip(words, words[1:]) if a and b]
        # a pair with the matrix's own subject says nothing of a case ("under FSDP2"), but "after PEFT" is an order
        out.update(f"{a} {b}" for a, b in pairs if a != b and not ({a, b} & (STOP - {"peft"})))
    return frozenset(out)


def _plain_pairs(title: str) -> FrozenSet[str]:
    """The title's phrases that are not its code-like terms again: a pair read inside one term (``fully_shard`` as
    "fully shard") or made of two (``TRL SFTTrainer``) would count those terms twice."""
    code = {w for t in _TERM.findall(title) for p in phrases(t) | {f"{t.lower()} {t.lower()}"} for w in p.split()}
    code |= {_stem(t.strip(".").lower()) for t in _TERM.findall(title)}
    return frozenset(p for p in phrases(title) if not set(p.split()) <= code)


@functools.lru_cache(maxsize=8)
def _distinct(titles: Tuple[Tuple[str, str], ...]) -> Dict[str, FrozenSet[str]]:
    """Each case's words (code-like terms and phrases) that few cases' titles share."""
    words = {case: terms(title) | _plain_pairs(title) for case, title in titles}
    counts: Dict[str, int] = {}
    for held_words in words.values():
        for word in held_words:
            counts[word] = counts.get(word, 0) + 1
    most = max(1, int(COMMON * len(titles)))
    fewest = max(1, int(PAIR_COMMON * len(titles)))
    return {
        case: frozenset(w for w in held_words if counts[w] <= (fewest if " " in w else most))
        for case, held_words in words.items()
    }


_PATH = re.compile(r"[^\s\"'`\[(]*[/\\][^\s\"'`]*?\.py\b\S*")
"""A file's path (a frame's): its folders name the libraries the run imports (``site-packages/trl/...``), not what
the report says."""


def _holds(text: str, term: str) -> bool:
    word = _CLASS_SUFFIX.sub(r"[\\s_-]?\1", re.escape(term.rstrip("()")))
    if "_" in term and not term.endswith("()"):
        # a library spells a setting with its own prefix or suffix (transformers' bnb_4bit_quant_storage,
        # accelerate's fsdp_use_orig_params): whole parts of one identifier, never a part of a word
        return bool(re.search(rf"(?:(?<![A-Za-z0-9_])|(?<=[A-Za-z0-9]_)){word}(?![A-Za-z0-9])", text, re.IGNORECASE))
    return bool(re.search(rf"(?<![A-Za-z0-9_]){word}(?![A-Za-z0-9_])", text, re.IGNORECASE))


def held(
    titles: Sequence[Tuple[str, str]], text: str, dtypes: bool = True, paired: bool = True
) -> Dict[str, Tuple[str, ...]]:
    """Case id -> the words of its title (those that tell cases apart) the report holds; cases it holds none of are
    left out. ``titles`` is (case id, title) for every case; without ``dtypes``, a dtype is no word (a title that
    quotes a message holds the message's dtypes); without ``paired``, only code-like terms are (no ``phrases``)."""
    text = normalise.dtypes(_PATH.sub(" ", text))
    pairs = phrases(text) if paired else frozenset()
    out = {}
    for case, words in _distinct(tuple(titles)).items():
        found = tuple(
            sorted(
                t for t in words if (dtypes or t not in _DTYPE_WORDS) and (t in pairs if " " in t else _holds(text, t))
            )
        )
        if found:
            out[case] = found
    return out


def calls(words: Sequence[str], text: str) -> int:
    """How many of a case's ``words`` are calls its title writes as calls (``disable_adapter()``, ``generate()``) that
    the report makes too (the name followed by ``(``, in code or a sentence): the entry that triggers the failure, as
    the repro calls it, which counts twice; a setting beside it (``use_orig_params``) is the setup many cases share,
    and a name written as a plain word may be a mention ("as disable_adapter does")."""
    text = _PATH.sub(" ", text)
    return sum(bool(re.search(rf"(?<![A-Za-z0-9_]){re.escape(w[:-2])}\s*\(", text)) for w in words if w.endswith("()"))


def named(
    titles: Sequence[Tuple[str, str]],
    text: str,
    messages: FrozenSet[str] = frozenset(),
    one_failure: Callable[[str, str], bool] = lambda a, b: False,
    ruled_out: FrozenSet[str] = frozenset(),
) -> Optional[Named]:
    """The one case the report's words name best, with ``LEAST`` evidence and ahead of every other; None otherwise.
    ``titles`` is (case id, title) for every case; ``messages`` the cases whose rule message is in the report.

    Cases named as much are no answer, unless ``one_failure(first, other)`` says they are one failure met two ways
    (they expect the same error): then the first of them in ``titles`` is named, the others in ``tied``, as a message
    that two cases expect names both. ``ruled_out``: cases the report cannot be about (another stack's), whose
    words still count in ``titles`` (what few titles share) but which neither are named nor tie with one that is."""
    found = [Named(case, words, case in messages, (), calls(words, text)) for case, words in held(titles, text).items()]
    found = [n for n in found if n.case not in ruled_out]
    found.sort(key=lambda n: -n.score)
    if not found or found[0].score < LEAST:
        return None
    tied = tuple(n.case for n in found[1:] if n.score >= found[0].score)
    if not all(one_failure(found[0].case, other) for other in tied):
        return None
    return Named(found[0].case, found[0].words, found[0].message, tied, found[0].called)


DTYPE_MISMATCH = re.compile(
    r"\b(?:dtypes?|data\s?types?|precision)\s+(?:mismatch|error|conflict)"
    r"|\bmismatch(?:ed|es)?\s+(?:between\s+|of\s+|in\s+)?(?:the\s+)?(?:dtypes?|data\s?types?|precision)"
    r"|\bmixed[- ]precision\s+(?:error|issue|problem|bug)"
    r"|\b(?:different|mixed|two|multiple|non-?uniform|inconsistent)\s+(?:param(?:eter)?\s+)?(?:dtypes|data\s?types)\b"
    r"|\buniform\s+(?:dtype|data\s?type)",
    re.IGNORECASE,
)
"""A dtype mismatch told in words, without its message: "mixed precision error", "dtype mismatch between bfloat16
(LoRA adapters) and uint8", "parameters of different dtypes". Not "the same dtype": a matmul's message says it too
(``mat1 and mat2 must have the same dtype``), which is another failure; and a dtype, not any "type" ("different
types" of layers)."""
FSDP2_WORDS = re.compile(r"fully_shard|\bfsdp[ _-]?v?2\b|FSDPModule|fsdp_version[\s:=\"']*2", re.IGNORECASE)
"""What says a report runs FSDP2, not FSDP1: the uniform-dtype check is each one's own."""


def described_dtype_case(
    text: str, candidates: Sequence[Tuple[str, str]], terms_held: Callable[[Sequence[Tuple[str, str]]], Dict]
) -> Optional[str]:
    """The case a dtype mismatch told in words names: of the ``candidates`` (case id, title: the cases whose rules
    raise a uniform-dtype error), those of the report's FSDP (a title that names FSDP2 for a report that does), then
    the one whose title's code words the report holds most (``terms_held``), the first on a tie (matrix.yaml's
    order: its general case first). None when the report tells no mismatch."""
    if not DTYPE_MISMATCH.search(text):
        return None
    two = bool(FSDP2_WORDS.search(text))
    mine = [(case, title) for case, title in candidates if bool(FSDP2_WORDS.search(title)) == two]
    if not mine:
        return None
    held_words = terms_held(mine)
    return max(mine, key=lambda c: (len(held_words.get(c[0], ())), -mine.index(c)))[0]
