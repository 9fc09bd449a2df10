"""Which rules and records a pasted error fits, and what the matrix knows about each matching case.

A rule fits when its regex is found in a pasted exception message (backticks and line breaks ignored on both
sides). The exception type and the raising module (from the frames' file paths) raise or lower the score but are
not required: users paste a trimmed tail, and another release may raise the same message from another module.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Iterable, Iterator, List, Mapping, Optional, Tuple

from packaging.version import InvalidVersion, Version

from fsdp_matrix import patterns
from fsdp_matrix.cells import Cell, expand_case
from fsdp_matrix.expectations import expected_for, version_matches
from fsdp_matrix.matrix import Case, Combo, Matrix
from fsdp_matrix.records import Record
from fsdp_matrix.triage import aliases, normalise, prose
from fsdp_matrix.triage.evidence import (
    Context,
    adapter_kinds,
    adapters_named,
    frame_hints_met,
    from_pretrained_init,
    loading_before_wrap,
    read_context,
)
from fsdp_matrix.triage.parse import Frame, Paste, PastedError
from fsdp_matrix.triage.stated import stated_versions
from fsdp_matrix.triage.versions import cannot_raise

TIE_WORDS = (
    ("DPOTrainer", re.compile(r"\bdpo\b", re.IGNORECASE)),
    ("DPO Trainer", re.compile(r"\bdpo\b", re.IGNORECASE)),
    ("SFTTrainer", re.compile(r"SFTTrainer|\bsft\b", re.IGNORECASE)),
    ("prepare_model_for_kbit_training", re.compile(r"kbit_training")),
    ("prepare_for_kbit_training", re.compile(r"kbit_training")),
    ("use_dora", re.compile(r"dora", re.IGNORECASE)),
    ("merge_and_unload", re.compile(r"merge")),
    ("resize_token_embeddings", re.compile(r"resiz")),
    ("generate(", re.compile(r"generate")),
    ("gradient_checkpointing", re.compile(r"checkpointing")),
    ("activation_checkpointing", re.compile(r"checkpointing")),
)
"""(context word of ``evidence.CONTEXT_WORDS``, what in a case's title, report, rules or sources names the same entry
or library path)."""

TITLE_WORD = 1.0
"""Ranking points per word of a case's title (those that tell cases apart) the paste names outside its messages, two
at most, as the context words: one word is below a case's own report (+1.5), two are above it."""
OUTSIDE = 2.0
"""Ranking points a rule loses when the versions the paste states cannot raise it: more than a case's own report
(+1.5), so that of two cases with one message the one those versions can raise comes first."""
SIMILAR = 0.75
"""How alike (difflib ratio, numbers masked) a record's message and a pasted one must be to call them the same."""
WEIGHTS = {"peft": 3.0, "torch": 2.0, "transformers": 1.0, "accelerate": 1.0, "bitsandbytes": 0.5}
"""How much a minor release apart in each package counts when looking for the combo nearest to the user's."""


@dataclass(frozen=True)
class Signature:
    """An error signature from matrix.yaml: a case's ``expect`` rule, or a platform rule."""

    case: Optional[str]
    """The case id; None for a platform rule."""
    where: str
    """``expect[3]`` or ``platform[0]``: which rule it is."""
    rule: Any
    """The rule object (``when``, ``versions``, ``source``, and ``error`` or ``signature``)."""
    before: bool = False
    """The warning the rule's error is raised after (its signature's ``warning``), not the error: a paste that
    prints it shows the failure's cause, with or without the error (a log cut before it, a silent run)."""

    @property
    def error(self) -> Any:
        if self.before:
            warning = self.rule.error.warning
            return WarningPattern(warning.match, str(warning.type))
        hang = getattr(self.rule, "hang", None)
        if hang is not None and hang.stack:
            return HangPattern(hang.stack)
        warning = getattr(self.rule, "warning", None)
        if warning is not None:
            return WarningPattern(warning.match, str(warning.type))
        return getattr(self.rule, "error", None) or getattr(self.rule, "signature", None)


@dataclass(frozen=True)
class HangPattern:
    """A ``hang`` rule's stack regex, in the shape of an error signature: a hang prints a deadlock report (a
    faulthandler dump, a watchdog's stacks) with the frames and no exception line."""

    match: str
    """The rule's ``hang.stack`` regex, searched in the paste's text (its frames)."""
    type: str = "hang"
    module: Optional[str] = None


@dataclass(frozen=True)
class WarningPattern:
    """A ``warning`` rule's signature, in the shape of an error signature: the run trains, and a rank prints the
    warning as Python does (``path.py:174: UserWarning: message``), a line the paste holds without an exception."""

    match: str
    """The rule's ``warning.match`` regex, searched in the paste's text."""
    type: str
    """The warning's class (``UserWarning``)."""
    module: Optional[str] = None


_WARNED_AT = r"((?:[A-Za-z]:)?[^\s:]+\.py):\d+:\s*(?:\w+\.)*{}:"
"""Where Python's ``warnings`` prints a warning: ``path.py:LINE: Category: message``."""


HANG_SIGNS = re.compile(
    r"most recent call first|Timeout \(\d|timed? ?out|deadlock|\bhang|\bhung\b|\bstuck\b|watchdog", re.IGNORECASE
)
"""What says a paste is a hang report: faulthandler's header, a timeout, the words people use."""


LEVELS = (("strong", 7.0), ("likely", 5.0), ("weak", 3.0))
"""Evidence points a fit needs for each level; below the last, nothing is claimed."""
POINTS = {
    "exact": 3.0,
    "case-insensitive": 2.0,
    "in the text": 2.0,
    "values": 2.0,
    "alias": 2.0,
    "part": 1.0,
    "loose": 1.0,
    "warning": 3.0,
}
"""Points for how the rule's message was found in the paste."""
GENERIC_WORDS = 4
"""A rule whose regex has this many words (besides "of", "to", "be"...) or fewer (``tuple index out of range``,
``'weight' must be 2-D``) names a
message any library raises: it is claimed only with a frame in its module or a frame hint."""


@dataclass
class Hit:
    """One signature that fits the paste, with the evidence for and against it."""

    signature: Signature
    score: float
    """Ranking score: the evidence points, plus the case's own report (+1, +0.5 for the report the case was written
    from) and context words the case names (ties)."""
    notes: List[str] = field(default_factory=list)
    """Why the fit is partial (another type, another module), shown to the user."""
    points: float = 0.0
    """Evidence points alone (message, class, module, FSDP, PEFT), which give the level."""
    evidence: List[str] = field(default_factory=list)
    """What the paste shows for this rule, in words."""
    against: Optional[str] = None
    """Why the paste is another failure with a similar message (DeepSpeed ZeRO-3, a config typo...): not claimed."""
    fit: str = "exact"
    """How the message was found: exact, case-insensitive, in the text, loose."""
    outside: Optional[str] = None
    """Why the versions the paste states cannot raise this rule (``versions.cannot_raise``): ranked lower, never
    strong."""
    context: float = 0.0
    """The ranking points of the context words the paste and the case both name (an entry, a library path)."""
    cause: bool = False
    """The paste prints the warning the rule's error is raised after (``Signature.before``): it shows why the error
    came (no input of a reentrant checkpoint needs grad), adapter or not."""

    @property
    def shown(self) -> float:
        """What the paste itself shows for this rule: its evidence points and the context words it shares with the
        case (not the case's own report, which ranks but is no evidence of this paste)."""
        return self.points + self.context

    @property
    def level(self) -> Optional[str]:
        """strong, likely or weak; None when the fit is not enough to claim, or the paste points elsewhere."""
        if self.against:
            return None
        # a fit that is not the rule's own message (other words, other values) is never strong
        points = min(self.points, LEVELS[1][1]) if self.fit in PARTIAL or self.outside else self.points
        # a report's words, without a message that fits on its own, are weak evidence at most
        points = min(points, LEVELS[2][1]) if self.fit == "words" else points
        return next((name for name, least in LEVELS if points >= least), None)


@dataclass
class CaseMatch:
    """A case the paste fits, through its rules, its observed records, or both."""

    case: Case
    """The case from matrix.yaml."""
    hits: List[Hit] = field(default_factory=list)
    """Its rules that fit, best first."""
    records: List[Record] = field(default_factory=list)
    """Records of this case whose observed error is the pasted one."""
    against: Optional[str] = None
    """Set when the paste points elsewhere for every rule: the case is shown as a similar message, not claimed."""
    tied: Optional[str] = None
    """Another case the paste shows exactly as much for: nothing tells them apart, so neither is strong."""

    @property
    def score(self) -> float:
        best = max((h.score for h in self.hits if h.level), default=None)
        if best is None:  # no claimable rule: ranked below every claimable case
            best = max((h.score for h in self.hits), default=0.0) - 100
        return best + (0.5 if self.records else 0.0)

    @property
    def level(self) -> Optional[str]:
        """The best claimable hit's level; a record of the same error alone is ``likely``."""
        if self.against:
            return None
        levels = [h.level for h in self.hits if h.level]
        if levels:
            best = min(levels, key=[name for name, _ in LEVELS].index)
            return LEVELS[1][0] if self.tied and best == LEVELS[0][0] else best
        return "likely" if self.records and not self.hits else None

    @property
    def shown(self) -> float:
        """What the paste shows for the case's best claimable rule (``Hit.shown``)."""
        return max((h.shown for h in self.hits if h.level), default=0.0)


@functools.lru_cache(maxsize=64)
def _plain(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def _pattern(regex: str) -> str:
    # users' pastes and other releases drop the backticks that some messages quote names with
    return regex.replace("`?", "").replace("`", "")


def _platform_rules(matrix: Matrix) -> List[Any]:
    """Platform rules with a signature, whatever shape the ``platform`` section has (a list, or a model of lists)."""
    platform = getattr(matrix, "platform", None)
    if platform is None:
        return []
    items = platform if isinstance(platform, (list, tuple)) else []
    if not items:
        for value in (getattr(platform, "__dict__", None) or {}).values():
            items += list(value) if isinstance(value, (list, tuple)) else []
    return [r for r in items if getattr(r, "error", None) or getattr(r, "signature", None)]


def signatures(matrix: Matrix) -> List[Signature]:
    """Every error signature of matrix.yaml: each case's ``expect`` errors, then the platform's."""
    out = [
        Signature(case.id, f"expect[{i}]", rule)
        for case in matrix.cases
        for i, rule in enumerate(case.expect)
        if rule.error is not None or (rule.hang is not None and rule.hang.stack) or rule.warning is not None
    ]
    out += [
        Signature(case.id, f"expect[{i}]", rule, before=True)
        for case in matrix.cases
        for i, rule in enumerate(case.expect)
        if rule.error is not None and rule.error.warning is not None
    ]
    return out + [Signature(None, f"platform[{i}]", rule) for i, rule in enumerate(_platform_rules(matrix))]


def _cites_own_report(case: Optional[Case], source: str) -> bool:
    """The rule's source opens with the case's own report (``peft#1702 (...)``, ``PR #2167: ...``): the rule is
    that report's failure, not the same error met by another case on its way."""
    if case is None:
        return False
    numbers = set(re.findall(r"#(\d+)", case.report)) | set(re.findall(r"/(?:issues|pull)/(\d+)", case.report))
    opening = re.match(r"\s*[\w./-]*?(?:PR\s*)?#(\d+)", source)
    return bool(opening) and opening.group(1) in numbers


def _primary_report(case: Optional[Case]) -> Optional[str]:
    """The first issue or PR number the case's report names: the report the case was written from."""
    found = re.search(r"(?:#|/(?:issues|pull)/)(\d+)", case.report) if case else None
    return found.group(1) if found else None


PARTIAL = ("loose", "values", "part", "alias")
"""Fits that are not the rule's own message (other words, other values, a part of it, another release's wording):
never strong."""
GENERIC_AGAINST = "a message many libraries raise"
"""How a fit of a generic message without a frame is turned down: the one reason a report's words may still name
its case (every other reason, frames elsewhere, another stack, is evidence against the words too)."""
LOOSE_WORDS = 6
"""A rule's regex needs this many words before a loose fit is tried: a short message must match exactly."""
LOOSE_COVER = 0.85
"""The share of the regex's words a message must hold to fit loosely; every word with a digit (a dtype, a size) must
be there, or one letter off (a typo in a title), for ``bfloat16 and float16`` is not ``bfloat16 and float32``."""
ALIKE = 0.85
"""How alike (difflib ratio) a message's word must be to a regex's word with a digit to stand for it."""
_STOPWORDS = {"of", "to", "be", "in", "on", "the", "and", "or", "an", "is", "for", "at", "by"}
_EXPANSIONS = 16
"""At most this many readings of a regex's ``(a|b)`` groups are compared with a message."""


@functools.lru_cache(maxsize=256)
def _words(text: str) -> frozenset:
    return frozenset(re.findall(r"[a-z][a-z0-9_]+", text.lower()))


def _readings(regex: str) -> List[str]:
    """The regex with each innermost ``(a|b)`` group read as one of its alternatives, so that a message need not
    hold the words of every alternative (``bfloat16|float16``) to fit."""
    # an escaped parenthesis (``\\(\\d+\\)``) is a literal one, not a group
    found = re.search(r"(?<!\\)\((?:\?:)?((?:[^()\\]|\\.)*)\)", regex)
    if not found:
        return [regex]
    out: List[str] = []
    for alternative in found.group(1).split("|"):
        out += _readings(regex[: found.start()] + alternative + regex[found.end() :])
        if len(out) >= _EXPANSIONS:
            break
    return out[:_EXPANSIONS]


@functools.lru_cache(maxsize=1024)
def _wanted(regex: str) -> List[frozenset]:
    plain = re.sub(r"\\[dswDSW]|\\.", " ", _pattern(regex))
    return [_words(reading) for reading in _readings(plain)]


def _has_alike(word: str, have: set) -> bool:
    return word in have or any(difflib.SequenceMatcher(None, word, w).ratio() >= ALIKE for w in have)


def _loose(regex: str, message: str) -> bool:
    """The regex's literal words are (nearly) all in the message, in one reading of its alternatives: e.g. the
    dtypes named the other way round (``float32 and bfloat16``: FSDP1 names the first dtype it met), which the
    regex's order does not allow, or one word misspelt in a title."""
    have = _words(message)
    for wanted in _wanted(regex):
        if len(wanted) < LOOSE_WORDS or len(wanted & have) < LOOSE_COVER * len(wanted):
            continue
        # a word with a digit or an underscore (a dtype, a size, an op: ``aten.copy_``) names what failed: another one
        # is another failure (``aten.mm`` got mixed Tensor and DTensor in a loss, not a load's copy_)
        if all(_has_alike(w, have) for w in wanted if any(c.isdigit() or c == "_" for c in w)):
            return True
    return False


def _generic(regex: str) -> bool:
    return max((len(w - _STOPWORDS) for w in _wanted(regex)), default=0) <= GENERIC_WORDS


def _message_fit(regex: patterns.Bounded, raw: str, paste: Paste) -> Tuple[Optional[str], List[PastedError]]:
    """How the rule's message is in the paste: exact, case-insensitive (on an exception line), in the text (a title,
    a sentence), with other values (``normalise``: numbers, shapes, names, paths; wrapped anywhere), loose; and the
    exception lines it was found on."""
    folded = patterns.Bounded(regex.pattern, re.IGNORECASE)
    for kind, pattern in (("exact", regex), ("case-insensitive", folded)):
        found = [e for e in paste.errors if any(pattern.search(_plain(m)) for m in e.spellings)]
        if found:
            return kind, found
    if folded.search(_plain(paste.text)):
        return "in the text", []
    readings = _readings(_pattern(raw))
    found = [e for e in paste.errors if normalise.fits(readings, e.message)]
    if found:
        return "values", found
    if normalise.fits(readings, paste.text):
        return "values", []
    found = [e for e in paste.errors if normalise.part(readings, e.message, _cut(e, paste))]
    if found:
        return "part", found
    if normalise.part(readings, paste.text):
        return "part", []
    found = [e for e in paste.errors if _loose(raw, e.message)]
    if found:
        return "loose", found
    for alias in aliases.of(regex):
        found = [e for e in paste.errors if alias.wording.search(_plain(e.message))]
        if found or alias.wording.search(_plain(paste.text)):
            return "alias", found
    # a line's words are the paste's words: when the whole paste lacks the rule's, no line has them. A line and the
    # next are read as one, for a title or a sentence wrapped at the width
    if _loose(raw, _plain(paste.text)) and any(_loose(raw, line) for line in _line_pairs(paste.lines)):
        return "loose", []
    return None, []


def _line_pairs(lines: List[str], longest: int = 600) -> Iterator[str]:
    """Each line shorter than ``longest``, and each with the next one joined to it (a wrapped title or sentence)."""
    short = [line if len(line) < longest else "" for line in lines]
    yield from (line for line in short if line)
    yield from (f"{a} {b}" for a, b in zip(short, short[1:]) if a and b)


def _cut(error: PastedError, paste: Paste) -> bool:
    """The exception line is where the paste stops (a stored excerpt, a truncated log): its message may be cut."""
    return bool(paste.errors) and error is paste.errors[-1] and paste.text.rstrip().endswith(error.message[-40:])


def _in_module(paste: Paste, module: str) -> bool:
    return any(m == module or m.startswith(module + ".") for m in paste.modules)


def _against(
    sig: Signature,
    case: Optional[Case],
    paste: Paste,
    ctx: Context,
    errors: List[PastedError],
    kind: str = "exact",
    warned: bool = False,
) -> Optional[str]:
    """Why this paste is another failure with a similar message, or None. ``warned``: the paste prints the warning
    the rule's error comes after (``_warned_before``)."""
    module = getattr(sig.error, "module", None) or ""
    fsdp_frames = any(f.startswith("frame") for f in ctx.fsdp)
    # a case whose title names no FSDP (reentrant checkpointing after PEFT) fails on another stack, or none, alike
    sharded = case is None or bool(FSDP_TITLE.search(case.title))
    if ctx.elsewhere and not fsdp_frames and sharded:
        return f"similar message, but this looks like {ctx.elsewhere[0][1]}"
    against = _unshown_stack(module, paste, ctx, errors, kind, sharded, warned)
    if against:
        return against
    if ctx.full_finetune and not ctx.peft:
        return (
            "similar message, but the model is trained whole (full fine-tuning or pretraining), without PEFT adapters"
        )
    if ctx.layer_cls_config and not ctx.peft and module.startswith("peft"):
        return (
            "similar message, but the paste names a layer class in fsdp_transformer_layer_cls_to_wrap: a config value "
            "the model lacks (transformers' or accelerate's check), not PEFT's wrap policy"
        )
    model_init = from_pretrained_init(paste)
    if model_init:
        return f"similar message, but it is raised in the model's own __init__ ({model_init}) under from_pretrained"
    if loading_before_wrap([f for e in errors for f in e.frames] or paste.frames, module):
        return f"similar message, but it is raised while from_pretrained loads the model (no frame of FSDP or {module})"
    if module.startswith("peft") and paste.modules and not ctx.peft:
        return f"similar message, but no frame or word of the paste shows PEFT, whose {module} raises it"
    raised = next((e.raised_in for e in errors if e.raised_in), None)
    if module and raised and not _in_module(paste, module):
        where = raised.module or raised.path
        return f"similar message, but it is raised in {where}, not in {module}"
    known = [m for m in paste.modules if m]
    fsdp_own = module.startswith("torch.distributed.fsdp")  # the message itself says FSDP raised it
    if len(known) >= 4 and not ctx.fsdp and not fsdp_own and case is not None and "FSDP" in case.title:
        return f"similar message, but no frame or word of the paste's {len(known)} frames shows FSDP"
    return None


REPORT_WORDS = 20
"""Words besides the exception lines that make a paste a report (versions, a setup, a command), not a bare error:
a report that never names FSDP is of a run without it."""


def _unshown_stack(
    module: str,
    paste: Paste,
    ctx: Context,
    errors: List[PastedError],
    kind: str,
    sharded: bool = True,
    warned: bool = False,
) -> Optional[str]:
    """Why a paste that never shows the stack every case runs on (FSDP, a PEFT adapter), or whose traceback raised
    the message elsewhere, is not claimed; None when nothing contradicts the rule. ``sharded``: the case's failure is
    FSDP's (its title names it), so a report without FSDP is another failure. ``warned``: the paste prints the
    warning the rule's error comes after, which shows its cause without the stack."""
    said = len(paste.text.split()) - sum(len(e.message.split()) for e in paste.errors)
    if kind in PARTIAL and not ctx.peft and (said >= REPORT_WORDS or len(paste.frames) >= 3):
        return "similar message with other words or values, and nothing in the paste shows a PEFT adapter"
    # a report (prose, versions, a command) without a single frame: what it says of its stack is all there is
    # a case that fails without FSDP too: without FSDP, a PEFT adapter is all that ties a report to it (a frozen
    # model under reentrant checkpointing raises its message with no adapter)
    # (unless the paste prints the warning that says why: reentrant checkpointing found no input needing grad)
    if (
        not sharded
        and not warned
        and not ctx.fsdp
        and not ctx.peft
        and (said >= REPORT_WORDS or len(paste.frames) >= 3)
    ):
        return "similar message, but the paste shows neither FSDP nor a PEFT adapter"
    if (
        sharded
        and not ctx.fsdp
        and not paste.frames
        and said >= REPORT_WORDS
        and not module.startswith("torch.distributed.fsdp")
    ):
        return "similar message, but nothing in the paste (frames, words, config) shows FSDP, which every case runs"
    own = [f for e in errors for f in e.frames]
    # a message quoted above a traceback cut before its exception line (a title): the paste's frames are its own
    return _frames_elsewhere(module, own or (list(paste.frames) if errors else []))


def _frames_elsewhere(module: str, traceback: List[Frame]) -> Optional[str]:
    """The matched traceback's own frames contradict the rule's module: its deepest frame of a known library is in
    another library, and no frame of it is in the rule's module (the message is another code path's)."""
    if not module:
        return None
    frames = [f for f in traceback if f.module]
    if not frames or any(f.module == module or f.module.startswith(module + ".") for f in frames):
        return None
    deepest = frames[-1].module
    theirs, ours = deepest.split(".", 1)[0], module.split(".", 1)[0]
    if theirs != ours and theirs in (
        "deepspeed",
        "megatron",
        "torchtune",
        "lightning",
        "pytorch_lightning",
        "fairscale",
        "colossalai",
    ):
        return f"similar message, but its traceback runs in {theirs} ({deepest}), not in {module}"
    return None


def _own(paste: Paste, errors: List[PastedError]) -> Paste:
    """The paste with only the frames of the tracebacks whose exception lines the rule matched, so that a paste of
    two tracebacks cites the matched one's frames only; the whole paste when those lines have no frames."""
    frames = [f for e in errors for f in e.frames]
    if not frames or len(set(frames)) == len(set(paste.frames)):
        return paste
    return Paste(paste.text, errors, frames, paste.lines, paste.errors_left_out)


def _evidence(
    sig: Signature, whole: Paste, whole_ctx: Context, kind: str, errors: List[PastedError]
) -> Tuple[float, List[str], List[str]]:
    """Evidence points, what supports the fit, and the notes on what is missing."""
    paste = _own(whole, errors)
    ctx = whole_ctx if paste is whole else read_context(paste)
    err = sig.error
    want = str(err.type).rsplit(".", 1)[-1]
    points, found, notes = POINTS[kind], [f"message: {kind}"], []
    if errors and any(e.short_type == want for e in errors):
        points += 1
        found.append(f"exception class {want}")
    elif errors:
        points -= 1
        notes.append(f"pasted as {errors[0].type}, the rule says {want}")
    module = getattr(err, "module", None)
    hints = frame_hints_met(list(getattr(err, "frames", None) or []), paste)
    if module and _in_module(paste, module):
        points += 2
        found.append(f"frame in {module}")
    elif hints:
        points += 2
        found += hints
    elif module and paste.modules:
        points -= 1
        notes.append(f"no pasted frame is in {module}")
    if ctx.fsdp:
        points += 1
        found.append("FSDP: " + ctx.fsdp[0])
    elif module and module.startswith("torch.distributed.fsdp") and (kind not in ("loose", "part") or errors):
        points += 1
        found.append("FSDP: the message is FSDP's own")
    if ctx.peft:
        points += 1
        found.append("PEFT: " + ctx.peft[0])
    elif ctx.has_context:
        points -= 1
        notes.append("nothing in the paste shows a PEFT adapter")
    return points, found, notes


def _tie_bonus(case: Optional[Case], ctx: Context) -> float:
    """Context words the paste and the case both name (an entry, a library path): they break ties."""
    if case is None:
        return 0.0
    text = " ".join([case.title, case.report] + [f"{r.when} {getattr(r, 'source', '')}" for r in case.expect])
    shared = [name for name, theirs in TIE_WORDS if name in ctx.words and theirs.search(text)]
    # above the case's own report (+1.5 at most): the paste's entry says more than which report came first
    return 1.0 * min(len(shared), 2)


def fit(sig: Signature, paste: Paste, case: Optional[Case] = None, ctx: Optional[Context] = None) -> Optional[Hit]:
    """How well a signature fits the paste, or None when its message is not in it."""
    err = sig.error
    try:
        regex = patterns.Bounded(_pattern(err.match))
    except patterns.error:
        return None
    if isinstance(err, HangPattern):
        return _hang_fit(sig, regex, paste, ctx or read_context(paste))
    if isinstance(err, WarningPattern):
        return _warning_fit(sig, regex, paste, ctx or read_context(paste))
    kind, errors = _message_fit(regex, err.match, paste)
    if kind is None:
        return None
    ctx = ctx or read_context(paste)
    points, found, notes = _evidence(sig, paste, ctx, kind, errors)
    warned = _warned_before(sig, paste)
    if warned:
        points += 1
        found.append(warned)
    if kind == "loose":
        notes.append("loose fit: the rule's words are in the message, its regex is not (another order or wording)")
    elif kind == "values":
        notes.append("the rule's message with other values (numbers, shapes, names, paths) or broken across lines")
    elif kind == "part":
        notes.append("part of the rule's message: quoted without its first or last words, or cut where the paste ends")
    elif kind == "alias":
        said = [a for a in aliases.of(regex) if a.wording.search(_plain(paste.text))]
        notes += [f"another release's wording: {a.why}" for a in said[:1]]
    against = _against(sig, case, paste, ctx, errors, kind, bool(warned))
    generic = _generic(err.match) or not getattr(err, "module", None)
    if not against and generic and not any(f.startswith("frame in") for f in found):
        where = getattr(err, "module", None) or "the rule's code path (it names no module)"
        against = f"{GENERIC_AGAINST}: claimed only with a frame in {where}"
    tie = _tie_bonus(case, ctx)
    score = points + tie
    source = getattr(sig.rule, "source", "") or ""
    if _cites_own_report(case, source):
        score += 1
        # among the case's own rules, the one of the report it was written from (peft#2166 before PR #2167)
        primary = _primary_report(case)
        score += 0.5 if primary and re.match(rf"\s*[\w./-]*?(?:PR\s*)?#{primary}\b", source) else 0
    return Hit(sig, score, notes, points, found, against, kind, context=tie, cause=bool(warned))


def _hang_fit(sig: Signature, regex: patterns.Bounded, paste: Paste, ctx: Context) -> Optional[Hit]:
    """A hang rule fits a deadlock report that holds its stack regex: the frames are the evidence (there is no
    exception line to read); an exception paste that merely passes through the same function is not a hang."""
    if not regex.search(paste.text):
        return None
    points, found, notes = 3.0, [f"stack: {sig.error.match}"], []
    if HANG_SIGNS.search(paste.text):
        points += 2
        found.append("a hang report (stacks, a timeout)")
    elif paste.errors:
        points -= 2
        notes.append(f"pasted with an exception ({paste.errors[-1].type}), the rule is a hang")
    points += _shown(ctx, found)
    return Hit(sig, points, notes, points, found, None, "stack")


def _shown(ctx: Context, evidence: List[str]) -> int:
    """A point for each of FSDP and a PEFT adapter the paste shows, each named in ``evidence``."""
    points = 0
    for label, seen in (("FSDP", ctx.fsdp), ("PEFT", ctx.peft)):
        if seen:
            points += 1
            evidence.append(f"{label}: {seen[0]}")
    return points


def _warning_fit(sig: Signature, regex: patterns.Bounded, paste: Paste, ctx: Context) -> Optional[Hit]:
    """A warning rule fits a paste that prints its warning: the message, and the line Python's ``warnings`` writes
    for it (its class and the file that raised it, which stands for a frame: a warning prints no traceback)."""
    text = _plain(paste.text)
    found = regex.search(text)
    if not found:
        return None
    points, evidence, notes = POINTS["exact"], [f"warning: {sig.error.match}"], []
    if sig.before:
        notes.append(f"the warning raised before the rule's error ({sig.rule.error.type}: {sig.rule.error.match})")
    starts = list(_places(regex, text))
    at = _printed(sig.error.type, text, starts)
    # a title or sentence that quotes the warning after its class ("UserWarning for DPO with LoRA: None of the
    # inputs ..."): the warning as the user saw it, without the file that raised it
    quoted = not at and any(re.search(rf"\b{re.escape(sig.error.type)}\b[^:\n]{{0,80}}:\s*$", text[:s]) for s in starts)
    if at:
        points += 1
        evidence.append(f"printed as a {sig.error.type} by {at.group(1)}")
    elif quoted:
        evidence.append(f"quoted after its class ({sig.error.type}), without the file that raised it")
    points += _shown(ctx, evidence)
    if not ctx.peft and ctx.has_context:
        points -= 1
        notes.append("nothing in the paste shows a PEFT adapter")
    against = None if at or quoted else "the warning's words, but not the line Python prints for the warning"
    if sig.before and not against:
        against = _without_its_error(sig, paste, ctx)
    return Hit(sig, points, notes, points, evidence, against, "warning", cause=sig.before)


def _without_its_error(sig: Signature, paste: Paste, ctx: Context) -> Optional[str]:
    """Why the warning a rule's error comes after (``Signature.before``) names nothing in a paste without that error,
    or None (the error is there too, or the paste shows a PEFT adapter and no other error)."""
    if fit(Signature(sig.case, sig.where, sig.rule), paste) is not None:
        return None
    if paste.errors:
        # the warning came, and the run then failed of something else: that error is the report's
        return f"the warning its error comes after, but the paste ends in another error ({paste.errors[-1].type})"
    if not ctx.peft:
        # any reentrant checkpoint whose inputs need no grad warns so (a model trained whole, a frozen tower): alone,
        # the warning is the case's only beside a PEFT adapter
        return "the warning its error comes after, alone, and nothing in the paste shows a PEFT adapter"
    return None


def _places(regex: patterns.Bounded, text: str, most: int = 20) -> Iterator[int]:
    """Where ``regex`` is found in ``text``, each start in order (``most`` at most: a log repeats a warning)."""
    offset = 0
    for _ in range(most):
        found = regex.search(text[offset:])
        if found is None:
            return
        yield offset + found.start()
        offset += max(found.end(), 1)


def _printed(category: str, text: str, starts: Iterable[int]) -> Optional[re.Match]:
    """The printed ``path.py:LINE: Category:`` before the first of the warning's places (``starts``) that has one:
    any of them may be the printed line, as a title that quotes the warning comes before the log that prints it."""
    return next(filter(None, (_printed_at(category, text, start) for start in starts)), None)


def _printed_at(category: str, text: str, start: int) -> Optional[re.Match]:
    """The ``path.py:LINE: Category:`` that Python's ``warnings`` prints before a warning's message found at
    ``start`` of ``text``; the message may name the module first (``transformer.h.1 has both parameters ...``)."""
    return re.search(_WARNED_AT.format(re.escape(category)) + r"[^:]{0,160}$", text[:start])


def _warned_before(sig: Signature, paste: Paste) -> Optional[str]:
    """The warning the rule's error is raised after, when the paste prints it as Python does: evidence that the
    error came the rule's way (torch's reentrant checkpoint found no input that needs grad)."""
    warning = getattr(getattr(sig.rule, "error", None), "warning", None)
    if sig.before or warning is None:
        return None
    text = _plain(paste.text)
    if not _printed(warning.type, text, _places(patterns.Bounded(_pattern(warning.match)), text)):
        return None
    return f"after the {warning.type} its run raises first: {warning.match}"


def _mask(text: str) -> str:
    return re.sub(r"\d+", "#", _plain(text).lower())


def record_fits(record: Record, paste: Paste) -> bool:
    """Is the record's observed error the pasted one? Same class name, and alike messages (numbers masked)."""
    obs = record.observed
    if not obs.error_type or not obs.error_message:
        return False
    mine = _mask(obs.error_message)
    for err in paste.errors:
        if err.short_type != obs.error_type.rsplit(".", 1)[-1]:
            continue
        theirs = _mask(err.message)
        short, long = sorted((mine, theirs), key=len)
        if len(short) >= 20 and short in long:
            return True
        if difflib.SequenceMatcher(None, mine[:300], theirs[:300]).ratio() >= SIMILAR:
            return True
    return False


def match(matrix: Matrix, paste: Paste, records: Iterable[Record] = ()) -> List[CaseMatch]:
    """The cases the paste fits, best first."""
    by_case: Dict[str, CaseMatch] = {}
    cases = {c.id: c for c in matrix.cases}
    ctx = read_context(paste)
    stated = stated_versions(paste.text)
    kinds = adapter_kinds(paste.text)
    # code-like words only: a phrase of a title ranks no message's case (two cases' titles paraphrase one failure)
    titled = prose.held([(c.id, c.title) for c in matrix.cases], _report_words(paste), dtypes=False, paired=False)
    for sig in signatures(matrix):
        case = cases.get(sig.case) if sig.case else None
        hit = fit(sig, paste, case, ctx)
        if hit is None or case is None:
            continue
        if titled.get(case.id):
            # a setting or entry of the case's title the paste names (modules_to_save, merge_and_unload) ranks it
            bonus = TITLE_WORD * min(len(titled[case.id]), 2)
            hit.context, hit.score = hit.context + bonus, hit.score + bonus
            hit.evidence.append(f"words of the case's title: {', '.join(titled[case.id])}")
        if kinds and not kinds & _adapters_of(case):
            # a setting the paste states that none of the case's cells has: DoRA's case for a LoRA paste
            hit.points, hit.score = hit.points - 1, hit.score - 1
            hit.notes.append(f"the paste's adapter is {'/'.join(sorted(kinds))}, no cell of this case runs one")
        hit.outside = cannot_raise(matrix, sig.rule, stated) if stated else None
        if hit.outside:
            hit.score -= OUTSIDE
            hit.notes.append(f"the versions the paste states cannot raise it: {hit.outside}")
        by_case.setdefault(case.id, CaseMatch(case)).hits.append(hit)
    for record in records:
        if record.case in cases and record_fits(record, paste):
            by_case.setdefault(record.case, CaseMatch(cases[record.case])).records.append(record)
    for found in by_case.values():
        found.hits.sort(key=lambda h: (h.level is None, -h.score))
        if found.hits and all(h.against for h in found.hits):
            found.against = found.hits[0].against
        elif not found.hits and ctx.elsewhere:
            found.against = f"similar message, but this looks like {ctx.elsewhere[0][1]}"
    _by_words(matrix, paste, ctx, by_case)
    _by_description(matrix, paste, ctx, by_case)
    found = sorted(by_case.values(), key=lambda m: -m.score)
    _ties(found)
    _thin_without_adapter(paste, ctx, found)
    return found


def _ties(found: List[CaseMatch]) -> None:
    """The first claimed case is not strong when the paste shows exactly as much for the next one (the same message,
    no entry, setting or frame that tells them apart): naming both lower is better than the wrong one strongly; what
    ranks it first (the case's own report) is no evidence of this paste."""
    claimed = [m for m in found if m.level]
    if len(claimed) >= 2 and claimed[0].shown == claimed[1].shown:
        # both ways: the second was printed strong below a likely first claim
        claimed[0].tied, claimed[1].tied = claimed[1].case.id, claimed[0].case.id
        for hit in claimed[0].hits[:1]:
            hit.notes.append(f"{claimed[1].case.id} fits with the same evidence: nothing in the paste tells them apart")


def _thin_without_adapter(paste: Paste, ctx: Context, found: List[CaseMatch]) -> None:
    """A claim with little to tell it (two cases fit alike, or weak evidence) in a report with a sentence of its own
    that never shows a PEFT adapter: nothing ties the paste to a case, whose failures are PEFT models' (a model's own
    parameters of two dtypes raise the uniform-dtype messages with no adapter). Nothing is claimed."""
    claimed = [m for m in found if m.level]
    if not claimed or ctx.peft or not (claimed[0].tied or claimed[0].level == "weak"):
        return
    if any(h.cause for h in claimed[0].hits if h.level):
        return  # the warning the error comes after shows the failure's cause: the adapter is not what ties it
    said = len(paste.text.split()) - sum(len(e.message.split()) for e in paste.errors)
    # a report (words or frames besides the message) with a sentence of its own: a bare traceback, or a title
    # alone, says nothing of adapters either way
    if (said >= REPORT_WORDS or len(paste.frames) >= 3) and prose_words(paste) >= PROSE_WORDS:
        for m in claimed:
            m.against = (
                "similar message, but two cases fit alike and nothing in the paste shows a PEFT adapter"
                if claimed[0].tied
                else "similar message, weak evidence, and nothing in the paste shows a PEFT adapter"
            )


PROSE_WORDS = 10
"""Plain words outside a paste's tracebacks and messages that make it a report of its own (a title and a sentence
about the run), whose silence on adapters counts: a bare traceback says nothing of them either way."""
_PLAIN = re.compile(r"[A-Za-z][a-z]+[.,;:!?]?")
_FRAME_LINE = re.compile(r"\s*File \"")


def prose_words(paste: Paste) -> int:
    """How many plain words (``benchmark``, ``fails``: no code, path or name) the paste's lines hold outside its
    tracebacks (from the first ``File "..."`` line to the last exception line, a wrapped code line included), its
    exception lines (also one a sentence quotes) and its environment listing."""
    messages = {" ".join(part.split()) for e in paste.errors for part in e.wrapped or [e.message]} - {""}
    said = [any(m in line for m in messages) for line in paste.lines]
    frames = [i for i, line in enumerate(paste.lines) if _FRAME_LINE.match(line)]
    last = max([i for i, m in enumerate(said) if m] + frames[-1:], default=-1)
    first = frames[0] if frames else last + 1
    return sum(
        bool(_PLAIN.fullmatch(token))
        for i, line in enumerate(paste.lines)
        if not said[i] and not first <= i <= last and not _LISTED.match(line)
        # an exception a sentence quotes (a title's ``... with "ValueError: ..."``) is the message, not the report
        for token in _INLINE_ERROR.split(line, 1)[0].split()
    )


def _by_words(matrix: Matrix, paste: Paste, ctx: Context, by_case: Dict[str, CaseMatch]) -> None:
    """A weak claim from the report's words (``prose``) when nothing else is claimed: the paste shows a PEFT adapter,
    and FSDP (another stack beside it or not) unless the case's title names no FSDP, and an exception line it has fits
    one of the named case's rules."""
    if any(m.level for m in by_case.values()) or not ctx.peft or ctx.full_finetune:
        return
    messages = frozenset(case for case, m in by_case.items() if m.hits)
    words = _report_words(paste)
    # a case whose cells never run the adapter the report names (DoRA, prompt tuning) is not named by its words
    named_kinds = adapters_named(words)
    cases = [c for c in matrix.cases if not named_kinds or named_kinds & _adapters_of(c)]
    cases = [c for c in cases if not _contradicted(c, paste.text)]
    settings = _failure_settings(matrix)
    # a case whose failure is FSDP's (its title says so) is not named from a report that shows no FSDP (only another
    # stack, or none), nor ties with one that is (TRL's trainers naming two FSDP cases beside gc-frozen-inputs)
    sharded = frozenset(c.id for c in cases if FSDP_TITLE.search(c.title)) if not ctx.fsdp else frozenset()
    found = prose.named(
        [(c.id, f"{_words_of(c)} ; {settings[c.id]}") for c in cases], words, messages, _one_failure(matrix), sharded
    )
    if found is None or ((paste.errors or _INLINE_ERROR.search(words)) and not found.message):
        return  # an exception (a line, or named in a sentence) that fits none of the case's rules is another error
    case = next(c for c in matrix.cases if c.id == found.case)
    seen = by_case.get(case.id)
    if seen and any(h.against and not h.against.startswith(GENERIC_AGAINST) for h in seen.hits):
        return  # the paste contradicts the case's message (frames elsewhere, loading): its words do not name it
    rule_sig = seen.hits[0].signature if seen and seen.hits else _first_error(case)
    if rule_sig is None:
        return
    hints = list(getattr(rule_sig.error, "frames", None) or [])
    if seen and hints and not any(_hint_named(h, words) for h in hints):
        # the rule's message is there, but not the entry that tells it from the same message elsewhere (generate()):
        # the title's words that repeat the message are no more
        return
    evidence = [f"words of the case's title and its failure's settings: {', '.join(found.words)}"]
    evidence += ["its rule's message (not claimed on its own)"] if found.message else []
    evidence += ["the report makes a call of the case's title (its trigger): counted twice"] if found.called else []
    evidence += [f"FSDP: {ctx.fsdp[0]}"] if ctx.fsdp else []
    evidence += [f"PEFT: {ctx.peft[0]}"]
    notes = ["named from the report's words, not from a message that fits: weak evidence at most"]
    notes += [f"{', '.join(found.tied)} named by as many words, with the same error: one failure"] if found.tied else []
    if ctx.elsewhere:
        notes.append(f"the report shows another stack too ({ctx.elsewhere[0][1]})")
    hit = Hit(rule_sig, LEVELS[2][1], notes, LEVELS[2][1], evidence, None, "words")
    by_case.setdefault(case.id, CaseMatch(case)).hits.insert(0, hit)
    by_case[case.id].against = None
    by_case[case.id].tied = found.tied[0] if found.tied else None


UNIFORM_DTYPE = re.compile(r"uniform (?:original parameter )?dtype")
"""A rule's message of FSDP's uniform-dtype check (FSDP1's flatten, FSDP2's fully_shard): the failure a report tells
in words as a dtype mismatch."""


def _by_description(matrix: Matrix, paste: Paste, ctx: Context, by_case: Dict[str, CaseMatch]) -> None:
    """A weak claim when nothing else is claimed and the report tells a dtype mismatch in words, without an exception
    line (``prose.DTYPE_MISMATCH``): it shows FSDP and a PEFT adapter, and no other stack; the case is one whose rules
    raise FSDP's uniform-dtype check, of the report's FSDP (``prose.described_dtype_case``)."""
    if any(m.level for m in by_case.values()) or paste.errors or not (ctx.peft and ctx.fsdp):
        return
    if ctx.elsewhere or ctx.full_finetune:
        return
    words = _report_words(paste)
    candidates = [
        (c.id, c.title)
        for c in matrix.cases
        if any(r.error is not None and UNIFORM_DTYPE.search(r.error.match) for r in c.expect)
    ]
    held = functools.partial(prose.held, text=words, dtypes=False, paired=False)
    named = prose.described_dtype_case(words, candidates, held)
    case = next((c for c in matrix.cases if c.id == named), None)
    if case is None:
        return
    # the rule of the report's FSDP: FSDP2's check names the "original parameter dtype", FSDP1's flatten does not
    fsdp2 = bool(prose.FSDP2_WORDS.search(words))
    uniform = [i for i, r in enumerate(case.expect) if r.error and UNIFORM_DTYPE.search(r.error.match)]
    rule = sorted(uniform, key=lambda i: ("original" in case.expect[i].error.match) != fsdp2)[0]
    evidence = [f"a dtype mismatch in words: {prose.DTYPE_MISMATCH.search(words).group(0)!r}"]
    evidence += [f"FSDP: {ctx.fsdp[0]}", f"PEFT: {ctx.peft[0]}"]
    notes = ["named from the report's words (a dtype mismatch, no message): weak evidence at most"]
    sig = Signature(case.id, f"expect[{rule}]", case.expect[rule])
    by_case.setdefault(case.id, CaseMatch(case)).hits.insert(
        0, Hit(sig, LEVELS[2][1], notes, LEVELS[2][1], evidence, None, "words")
    )
    by_case[case.id].against = None


QUANTIZED = re.compile(
    r"q(?:lo|do)ra|\b(?:4|8)[ -]?bit|\bint[48]\b|\bnf4\b|bnb|bitsandbytes|quanti[sz]|Params4bit|uint8", re.I
)
"""What shows a quantized base (QLoRA, a 4- or 8-bit bitsandbytes model, any quantization word)."""
FSDP1_WORDS = re.compile(r"\bfsdp1\b|FullyShardedDataParallel|use_orig_params|FULL_STATE_DICT|auto_wrap_policy", re.I)
"""What shows a report runs FSDP1 (its wrapper class, its settings)."""


def _contradicted(case: Case, text: str) -> Optional[str]:
    """Why a report's words cannot name the case, or None: the case's cells all run a quantized base (QLoRA, QDoRA)
    and nothing in the report is quantized; or the case's title names one FSDP (FSDP1, or FSDP2's ``fully_shard``)
    and the report shows only the other. Its words are the same setup met on another stack."""
    if _adapters_of(case) <= {"qlora", "qdora"} and not QUANTIZED.search(text):
        return "the case runs a quantized base, and nothing in the report is quantized"
    one, two = bool(FSDP1_WORDS.search(text)), bool(prose.FSDP2_WORDS.search(text))
    # a title that names both ("FSDP1 or FSDP2") is either's
    title_one, title_two = bool(re.search(r"\bFSDP1\b", case.title)), bool(prose.FSDP2_WORDS.search(case.title))
    if title_one and not title_two and two and not one:
        return "the case is FSDP1's, and the report runs FSDP2"
    if title_two and not title_one and one and not two:
        return "the case is FSDP2's, and the report runs FSDP1"
    return None


HINT_WORDS = {"generate": re.compile(r"generat|\bgrpo|\bppo\b|\brloo\b|online[ _-]?dpo", re.IGNORECASE)}
"""What a report says for a rule's frame hint besides its name: TRL's online trainers (GRPO, PPO, RLOO, online DPO)
call ``generate()`` on the trained model every step."""


def _hint_named(hint: str, words: str) -> bool:
    """Whether a report's words name a rule's frame hint (a function, or a module's last part), or an entry that
    runs it (``HINT_WORDS``)."""
    name = hint.rsplit(".", 1)[-1]
    alias = HINT_WORDS.get(name)
    return bool(re.search(rf"\b{re.escape(name)}", words, re.IGNORECASE) or (alias and alias.search(words)))


def _one_failure(matrix: Matrix) -> Callable[[str, str], bool]:
    """Whether two cases expect one same error (its class and message): one failure that two cases meet two ways
    (gc-frozen-inputs and ac-entries both expect ``no-grad-fn``)."""
    errors = {c.id: {(str(r.error.type), r.error.match) for r in c.expect if r.error is not None} for c in matrix.cases}
    return lambda a, b: bool(errors.get(a, set()) & errors.get(b, set()))


FSDP_TITLE = re.compile(r"fsdp|fully_?shard|shard|ram-efficient|\branks?\b", re.IGNORECASE)
"""A case whose title names FSDP, sharding, ranks or accelerate's ram-efficient loading fails in a sharded run only: a
report's words name it only when the report shows FSDP. One whose title does not (gc-frozen-inputs: reentrant
checkpointing after PEFT) fails without FSDP too, and users report it from runs without FSDP."""

_ADAPTERS: Dict[int, Tuple[Case, FrozenSet[str]]] = {}


_LISTED = re.compile(r"\s*[-*]?\s*`?[\w .-]+?`?\s+version\s*:", re.IGNORECASE)
"""A line of an environment listing (``- TRL version: 0.9.6``, transformers-cli env's and LLaMA-Factory's): a package
installed, not a library the run used."""
_INLINE_ERROR = re.compile(r"(?<![\w.])(?:[A-Z]\w*)(?:Error|Exception):\s+\S")
"""An exception named in a sentence (``... got `RuntimeError: CUDA error: invalid argument` ...``), which the parser
does not read as a traceback's exception line."""


def _report_words(paste: Paste) -> str:
    """The paste without its exception messages and its environment listing: the words are the report's, and a
    message's own words (its dtypes, ``use_orig_params=False``) are counted once, as its fit."""
    text = functools.reduce(lambda text, e: text.replace(e.message, " "), paste.errors, paste.text)
    listed = [" ".join(line.split()) for line in paste.lines if _LISTED.match(line)]
    return functools.reduce(lambda text, line: text.replace(line, " "), listed, text) + _bridges(paste)


BRIDGED_LINES = 300
"""Lines whose breaks ``_bridges`` reads joined: a title and a report's prose, not the log pasted after them."""


def _bridges(paste: Paste) -> str:
    """The words on either side of each line break, read with the break closed (``... an a`` / ``ssertion error``
    -> ``an assertion error``): a report cut at a terminal's or an e-mail's width, inside a word as often as between
    two. Each is its own sentence (a pair of words is never read across two of them). An exception's lines and an
    environment listing's are not the report's words."""
    messages = {" ".join(part.split()) for e in paste.errors for part in e.wrapped or [e.message]}
    lines = ["" if _LISTED.match(line) or any(m and m in line for m in messages) else line for line in paste.lines]
    out = []
    # a report's words come before its log: a long log's line breaks are not read joined (time, not words)
    for above, below in zip(lines[:BRIDGED_LINES], lines[1 : BRIDGED_LINES + 1]):
        tail, head = above.split()[-2:], below.split()[:2]
        if tail and head:
            out.append(" ".join(tail[:-1] + [tail[-1] + head[0]] + head[1:]))
    return "".join(f" ; {bridge}" for bridge in out)


def _adapters_of(case: Case) -> FrozenSet[str]:
    """The ``adapter`` values of the case's cells (``lora`` for a case without the axis), read once per case."""
    known = _ADAPTERS.get(id(case))
    if known is None or known[0] is not case:
        known = _ADAPTERS[id(case)] = (
            case,
            frozenset(str(c.context().get("adapter", "lora")) for c in expand_case(case)),
        )
    return known[1]


def _words_of(case: Case) -> str:
    """What a report may name a case by: its title, and the classes of the errors its rules expect (a report says
    "an assertion error" where a traceback says ``AssertionError: ...``)."""
    classes = sorted({str(r.error.type).rsplit(".", 1)[-1] for r in case.expect if r.error is not None})
    return " ".join([case.title] + classes)


FAILURE_AXIS_CASES = 2
"""An axis that at most this many cases' failing rules turn on tells those cases apart (``storage``: mixed-dtype's
and fsdp2-qlora-accelerate's 4-bit storage); one that many turn on (``wrap``, ``orig``: 17 and 9 cases) is setup
every FSDP case shares."""
_SETTINGS: Dict[int, Tuple[Matrix, Dict[str, str]]] = {}


def _failing_axes(case: Case) -> FrozenSet[str]:
    """The axes the case's failing rules (an error, a hang, a warning) turn on: the keys of their ``when``."""
    axes: set = set()
    for rule in case.expect:
        if rule.error or rule.errors or rule.hang or rule.warning:
            for when in rule.when if isinstance(rule.when, list) else [rule.when]:
                axes |= set(when or {})
    return frozenset(axes)


def _failure_settings(matrix: Matrix) -> Dict[str, str]:
    """Case id -> the settings its failure turns on, as words a report may name it by: for each axis its failing
    rules turn on that few cases' do (``FAILURE_AXIS_CASES``), the setting the axis's meaning names
    (``prose.setting_names``: ``storage`` is bitsandbytes' ``quant_storage``). A report of the fix names that setting
    ("add bnb_4bit_quant_storage for FSDP + QLoRA") where it names no word of the case's title. Read once per matrix."""
    known = _SETTINGS.get(id(matrix))
    if known is not None and known[0] is matrix:
        return known[1]
    failing = {case.id: _failing_axes(case) for case in matrix.cases}
    counts: Dict[str, int] = {}
    for axes in failing.values():
        for name in axes:
            counts[name] = counts.get(name, 0) + 1
    out = {}
    for case in matrix.cases:
        # a case's own axis (case.axes) is its own vocabulary; the built-in ones (device, world_size) mean nothing
        declared = [case.axes.get(name) or matrix.axes.get(name) for name in sorted(failing[case.id])]
        rare = [a for name, a in zip(sorted(failing[case.id]), declared) if a and counts[name] <= FAILURE_AXIS_CASES]
        out[case.id] = " ".join(sorted(set().union(*(prose.setting_names(a.meaning) for a in rare))))
    _SETTINGS[id(matrix)] = (matrix, out)
    return out


def _first_error(case: Case) -> Optional[Signature]:
    """The case's first rule with an error, or a warning (fsdp1-frozen-mixed-unit expects only a warning)."""
    return next(
        (Signature(case.id, f"expect[{i}]", r) for i, r in enumerate(case.expect) if r.error or r.warning), None
    )


def claims(found: List[CaseMatch]) -> List[CaseMatch]:
    """The cases the paste is claimed to be, best first: those with a level."""
    return [m for m in found if m.level]


def platform_hits(matrix: Matrix, paste: Paste) -> List[Hit]:
    """Platform signatures the paste fits (a fact about a release, not about one case)."""
    ctx = read_context(paste)
    hits = [fit(sig, paste, None, ctx) for sig in signatures(matrix) if sig.case is None]
    return sorted((h for h in hits if h), key=lambda h: -h.score)


def _minor(version: Optional[str]) -> Optional[float]:
    try:
        release = Version(version).release if version else None
    except InvalidVersion:
        return None
    return release[0] * 1000 + (release[1] if len(release) > 1 else 0) if release else None


def distance(versions: Mapping[str, Optional[str]], combo: Combo) -> float:
    """Minor releases between the user's versions and a combo's pins, weighted by package (unknown ones ignored)."""
    total = 0.0
    for package, weight in WEIGHTS.items():
        mine, theirs = _minor(versions.get(package)), _minor(getattr(combo.pins, package))
        if mine is not None and theirs is not None:
            total += weight * abs(mine - theirs)
    return total


def nearest_combo(matrix: Matrix, versions: Mapping[str, Optional[str]], tag: str = "cpu") -> Optional[Combo]:
    """The ``tag`` combo nearest to the user's versions; None when no version is known."""
    if not any(versions.get(p) for p in WEIGHTS):
        return None
    tagged = [c for c in matrix.combos if tag in c.tags] or list(matrix.combos)
    return min(tagged, key=lambda c: distance(versions, c))


def reproducing_cells(case: Case, paste: Paste, versions: Mapping[str, Optional[str]]) -> List[Cell]:
    """The case's CPU cells whose expected error on these versions is the pasted one."""
    out = []
    for cell in expand_case(case):
        rule = _rule_for(case, cell, versions)
        if rule is not None and rule.error is not None and fit(Signature(case.id, "", rule), paste):
            out.append(cell)
    return out


def _rule_for(case: Case, cell: Cell, versions: Mapping[str, Optional[str]]) -> Any:
    expected = expected_for(case, cell, versions)
    return case.expect[expected.rule] if expected.rule is not None else None


def rule_versions(rule: Any) -> str:
    """``peft <0.14, accelerate >=0.30`` or ``any version``."""
    specs = getattr(rule, "versions", None) or {}
    return ", ".join(f"{p} {s}" for p, s in specs.items()) or "any version"


def in_range(rule: Any, versions: Mapping[str, Optional[str]]) -> Optional[bool]:
    """Whether the user's versions are in the rule's range; None when a version it names is unknown."""
    specs = getattr(rule, "versions", None) or {}
    if any(versions.get(p) is None for p in specs):
        return None
    return all(version_matches(s, versions.get(p)) for p, s in specs.items())
