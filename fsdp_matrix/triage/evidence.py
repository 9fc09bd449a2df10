"""What a paste shows besides its message: the stack it ran on (FSDP, PEFT), the entry it came through (TRL's
trainers, ``accelerate launch``), and the signs that it is another failure with the same words (DeepSpeed ZeRO-3,
Megatron, a model's own ``__init__``, a model trained without adapters, a layer class named in the config).

Every case of the matrix is a PEFT adapter under PyTorch FSDP, so a paste that shows neither is a weaker fit, and one
that shows another stack is not claimed at all (its message only looks alike).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import FrozenSet, List, Optional, Set, Tuple

from fsdp_matrix.triage.parse import Frame, Paste, PastedError

FSDP_MODULES = (
    "torch.distributed.fsdp",
    "torch.distributed._composable.fsdp",
    "torch.distributed._composable.fully_shard",
    "accelerate.utils.fsdp_utils",
)
"""Modules whose frames show the model was under FSDP (FSDP1, FSDP2's ``fully_shard``, accelerate's FSDP plugin)."""
_FSDP_WORDS = re.compile(r"fsdp|fully_?shard|FullyShardedDataParallel|distributed_type:\s*FSDP|--fsdp\b", re.IGNORECASE)
# "PEFT version: 0.15.0" in an environment listing says PEFT is installed, not that the model has adapters
# a word by ASCII bounds: "FSDP2训练LoRA报错" names LoRA, though CJK characters are word characters to \b
_PEFT_WORDS = re.compile(
    r"(?<![A-Za-z0-9_])(?:q?lora|q?dora|loraconfig|get_peft_model|peft_config|peftmodel\w*|adapters?|"
    r"prefix[ _-]tuning|prompt[ _-]tuning|use_peft|peft(?!\s*(?:version|==|:\s*\d|\s+\d|\s*=\s*\d)))(?![A-Za-z0-9_])",
    re.IGNORECASE,
)
# the user's own script named for its adapter (run_clm_pt_with_peft.py, finetune_lora.py): a library's file (a path
# through site-packages) or a helper in a frame's code line (transformers' _is_peft_model) is not the run's adapter
_SCRIPT_ADAPTER = re.compile(
    r"(?<![\w./\\-])((?:[\w.-]*[/\\])*)([\w-]*?(?<![A-Za-z0-9])(?:q?lora|q?dora|peft)(?![A-Za-z0-9])[\w-]*\.py)\b",
    re.IGNORECASE,
)
# a 4-bit bitsandbytes base cannot be trained itself (its weights are not floating point): what trains is an adapter
_FOUR_BIT = re.compile(
    r"Params4bit|Linear4bit|load_in_4bit|bnb_4bit\w*|\bnf4\b|\b4-?bit quantized|\buint8\b",
    re.IGNORECASE,
)
_FUNCTION_HINTS = re.compile(r"^[A-Za-z_]\w*$")

ELSEWHERE: Tuple[Tuple[str, re.Pattern[str], str], ...] = (
    (
        "deepspeed",
        # "DeepSpeed version: 0.15.4" is an environment listing (LLaMA-Factory's), not the stack that ran
        re.compile(
            r"deepspeed(?!\s*version)|\bzero[-_ ]?(?:stage[-_ ]?)?3\b|\bstage 3\b|\bz3\b|zero_optimization",
            re.IGNORECASE,
        ),
        "DeepSpeed ZeRO-3, not FSDP",
    ),
    ("megatron", re.compile(r"megatron", re.IGNORECASE), "Megatron, not FSDP"),
    (
        "context-parallel",
        re.compile(r"context[ _-]parallel|sequence[ _-]parallel|\bcp_size\b", re.IGNORECASE),
        "context parallelism (the sequence is split across ranks), which no case of the matrix runs",
    ),
)
"""Stacks other than FSDP that raise the same messages: (name, pattern in the paste's text or frames, reason)."""
# a word of its own (ASCII bounds): "summon_full_params" is FSDP1's API, not a run trained whole
_FULL_FINETUNE = re.compile(
    r"(?<![A-Za-z0-9_])(?:full[ _-]?fine[ _-]?tun|finetuning_type:\s*full|full[ _-]param|continue[ _-]?pre-?train)"
    r"|\bOSFT\b",
    re.IGNORECASE,
)
_GATHERED = re.compile(r"(?:summon\w*|gather\w*|unshard\w*)[\s_]+(?:the\s+)?$", re.IGNORECASE)
"""What FSDP does to reach a shard's whole tensors (``summon_full_params``, which matrix.yaml's merge gathers with;
FSDP2's ``unshard()``; "gather full parameters"): the full parameters after it are gathered, not all trained."""
_LAYER_CLS_CONFIG = re.compile(r"transformer_layer_cls_to_wrap|FSDP_TRANSFORMER_CLS_TO_WRAP", re.IGNORECASE)

CONTEXT_WORDS = (
    "DPOTrainer",
    "DPO Trainer",
    "SFTTrainer",
    "GRPOTrainer",
    "prepare_model_for_kbit_training",
    "prepare_for_kbit_training",
    "accelerate launch",
    "fsdp_config",
    "use_dora",
    "merge_and_unload",
    "resize_token_embeddings",
    "generate(",
    "gradient_checkpointing",
    "activation_checkpointing",
)
"""Words that name an entry or a library path; a case whose title, report or rule source names one gets the tie."""


_NEGATED = re.compile(
    r"(?:\bwithout|\bw/o|\bnot(?:\s+(?:using|use|with|on))?|\bno|\binstead\s+of|\brather\s+than)\W{0,3}$", re.IGNORECASE
)
"""Words before another stack's name that say the run did not use it ("when not using deepspeed", "without
DeepSpeed"): the report rules that stack out (axolotl#857's title: "... without deepspeed")."""


def _affirmed(pattern: re.Pattern[str], text: str) -> bool:
    """Whether the text names the pattern's stack once without a negation just before it, and not as one item of a
    list that names FSDP too."""
    return any(
        not _NEGATED.search(text[max(0, m.start() - 24) : m.start()]) and not _listed_beside_fsdp(text, m)
        for m in pattern.finditer(text)
    )


_LIST = re.compile(r"[\w.-]+(?:\s*,\s*[\w.-]+)+")
"""Two or more comma-separated names on one line (a template's list of modules, a pair of tags)."""


def _listed_beside_fsdp(text: str, found: re.Match[str]) -> bool:
    """The stack is one item of a list whose other items name FSDP too: verl's pull-request template lists its
    modules ("fsdp,megatron,sglang,vllm,...") in every report, which named no stack that ran (split version 7's verl
    paste was ruled out as Megatron by it, read after that split's measurement)."""
    start = text.rfind("\n", 0, found.start()) + 1
    end = text.find("\n", found.end())
    line = text[start : end if end >= 0 else len(text)]
    for listed in _LIST.finditer(line):
        if listed.start() <= found.start() - start and found.end() - start <= listed.end():
            items = [item.strip().lower() for item in listed.group(0).split(",")]
            return any("fsdp" in item for item in items if found.group(0).lower() not in item)
    return False


@dataclass
class Context:
    """What the paste shows, read once and shared by every rule tried on it."""

    fsdp: List[str] = field(default_factory=list)
    """Why the paste looks like FSDP (a frame, a word); empty when nothing says so."""
    peft: List[str] = field(default_factory=list)
    """Why the paste looks like a PEFT model (a frame, a word)."""
    elsewhere: List[Tuple[str, str]] = field(default_factory=list)
    """(name, reason) of other stacks the paste shows."""
    full_finetune: bool = False
    """The paste says the model is trained whole (full fine-tuning, pretraining): no adapters."""
    layer_cls_config: bool = False
    """The paste names a layer class in ``fsdp_transformer_layer_cls_to_wrap`` (a config value)."""
    words: List[str] = field(default_factory=list)
    """The ``CONTEXT_WORDS`` the paste holds."""
    has_context: bool = False
    """The paste is more than its message: several frames, or prose around it."""


def _frames_in(frames: List[Frame], prefixes: Tuple[str, ...]) -> List[str]:
    return sorted({f.module for f in frames if f.module and f.module.startswith(prefixes)})


def read_context(paste: Paste) -> Context:
    """The stack, the entry and the other-stack signs of a paste (read once per paste: every rule asks)."""
    return _read_context(paste.text, tuple(paste.frames), tuple(paste.errors))


@functools.lru_cache(maxsize=16)
def _read_context(text: str, frames: Tuple[Frame, ...], errors: Tuple[PastedError, ...]) -> Context:
    paste = Paste(text=text, errors=list(errors), frames=list(frames))
    ctx = Context()
    fsdp_frames = _frames_in(paste.frames, FSDP_MODULES)
    ctx.fsdp = [f"frame in {m}" for m in fsdp_frames[:2]]
    if _FSDP_WORDS.search(paste.text):
        ctx.fsdp.append(f"the paste says {_FSDP_WORDS.search(paste.text).group(0)!r}")
    peft_frames = _frames_in(paste.frames, ("peft.",))
    ctx.peft = [f"frame in {m}" for m in peft_frames[:2]]
    if _PEFT_WORDS.search(paste.text):
        ctx.peft.append(f"the paste says {_PEFT_WORDS.search(paste.text).group(0)!r}")
    elif _script_adapter(paste.text):
        ctx.peft.append(f"the run's script is named for its adapter ({_script_adapter(paste.text)!r})")
    elif _FOUR_BIT.search(paste.text):
        ctx.peft.append(f"a 4-bit base ({_FOUR_BIT.search(paste.text).group(0)!r}) trains only through adapters")
    paths = " ".join(f.path for f in paste.frames)
    for name, pattern, reason in ELSEWHERE:
        if _affirmed(pattern, paste.text) or pattern.search(paths):
            ctx.elsewhere.append((name, reason))
    ctx.full_finetune = any(
        not _GATHERED.search(paste.text[max(0, m.start() - 30) : m.start()])
        for m in _FULL_FINETUNE.finditer(paste.text)
    )
    ctx.layer_cls_config = bool(_LAYER_CLS_CONFIG.search(paste.text))
    lowered = paste.text.lower()
    ctx.words = [w for w in CONTEXT_WORDS if w.lower() in lowered]
    message_words = sum(len(e.message.split()) for e in paste.errors)
    ctx.has_context = len(paste.frames) >= 3 or len(paste.text.split()) - message_words >= 40
    return ctx


def _script_adapter(text: str) -> Optional[str]:
    """The first script of the paste named for an adapter, outside an installed library; None when none is."""
    return next(
        (m.group(2) for m in _SCRIPT_ADAPTER.finditer(text) if not re.search(r"(site|dist)-packages", m.group(1))),
        None,
    )


def from_pretrained_init(paste: Paste) -> Optional[str]:
    """The model class whose own ``__init__`` raised under ``from_pretrained``, if the paste shows that."""
    loading = any(f.function == "from_pretrained" for f in paste.frames)
    raised = next((e.raised_in for e in reversed(paste.errors) if e.raised_in), None)
    if loading and raised and raised.function == "__init__" and (raised.module or "").startswith("transformers.models"):
        return raised.module
    return None


def frame_hints_met(hints: List[str], paste: Paste) -> List[str]:
    """The rule's frame hints the paste's frames meet: a dotted module prefix, or a function name."""
    met = []
    for hint in hints:
        if _FUNCTION_HINTS.match(hint):
            # IPython names a method with its class: LoraModel.merge_and_unload
            if any(f.function and f.function.rsplit(".", 1)[-1] == hint for f in paste.frames):
                met.append(f"frame in {hint}()")
        elif any(f.module and (f.module == hint or f.module.startswith(hint + ".")) for f in paste.frames):
            met.append(f"frame in {hint}")
    return met


def loading_before_wrap(frames: List[Frame], module: str) -> bool:
    """The traceback runs inside transformers' ``from_pretrained`` with no frame of FSDP and none of the rule's
    ``module``: the message was raised while the model loaded, before anything was wrapped (bitsandbytes building
    ``Params4bit`` in ``from_pretrained`` raises torch's requires-grad error too)."""
    loading = any(f.function == "from_pretrained" and (f.module or "").startswith("transformers.") for f in frames)
    fsdp = any(f.module and f.module.startswith(FSDP_MODULES) for f in frames)
    mine = any(f.module and (f.module == module or f.module.startswith(module + ".")) for f in frames)
    return bool(module) and loading and not fsdp and not mine


ADAPTER_KINDS: Tuple[Tuple[re.Pattern[str], FrozenSet[str]], ...] = (
    (re.compile(r"(?<![A-Za-z0-9])(?:q?dora|use_dora)(?![A-Za-z0-9])", re.IGNORECASE), frozenset({"dora", "qdora"})),
    (re.compile(r"prompt[ _-]tuning|PromptTuningConfig", re.IGNORECASE), frozenset({"prompt"})),
    (re.compile(r"\btarget_parameters\b"), frozenset({"lora_params"})),
)
"""Words that name an adapter other than plain LoRA, and the ``adapter`` axis values that run it (matrix.yaml's
axes: dora is LoRA with use_dora, lora_params LoRA on parameters)."""


def adapters_named(text: str) -> Set[str]:
    """The ``adapter`` values of the kinds the paste names (DoRA, prompt tuning, LoRA on parameters); empty when it
    names only LoRA or nothing."""
    return {kind for pattern, kinds in ADAPTER_KINDS if pattern.search(text) for kind in kinds}


_LORA = re.compile(r"(?<![A-Za-z0-9])(?:q?lora|loraconfig)(?![A-Za-z0-9])", re.IGNORECASE)


def adapter_kinds(text: str) -> Set[str]:
    """The ``adapter`` values the paste's adapter can be: the kinds it names (``adapters_named``), else LoRA's
    (``lora``, ``qlora``, and ``lora_params``: LoRA on MoE experts is still called LoRA) when it names only LoRA;
    empty when it names none."""
    return adapters_named(text) or ({"lora", "qlora", "lora_params"} if _LORA.search(text) else set())
