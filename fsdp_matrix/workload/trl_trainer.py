"""The ``trl`` entry: TRL's ``SFTTrainer`` (or ``DPOTrainer``) with ``peft_config`` and ``fsdp`` / ``fsdp_config``.

TRL is given the *base* model and a ``LoraConfig``, as its docs and PEFT's FSDP examples write it: TRL applies PEFT
itself (``get_peft_model``, and for a 4-bit base its own casting, ``prepare_model_for_kbit_training`` in some
releases), then the transformers Trainer underneath wraps the model in FSDP inside ``train()``. The dataset is tiny
and in memory (``datasets.Dataset.from_dict``), the tokenizer is built in code (a ``tokenizers`` WordLevel vocabulary
over the tiny models' ids), and training is 3 steps. The same CPU shim and checks as the ``trainer`` entry apply
(hf_trainer.py): the model TRL trained must be the FSDP version the cell asked for, and the corruption checks run
with a reference taken from TRL's PEFT model before wrapping.

TRL's API moved across the pinned releases (0.8.6 .. 1.16.0): before 0.9 the SFT options are ``SFTTrainer``
arguments and there is no ``SFTConfig``; the tokenizer argument is ``tokenizer`` before 0.12 and ``processing_class``
from it; ``max_seq_length`` became ``max_length``. The options are passed under whichever name this release has.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
from typing import Any, Dict, Iterator, List, Mapping

import torch
from torch import nn

from fsdp_matrix.workload.adapters import adapter_dtypes
from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.cpu_shim import cpu_fsdp_shim
from fsdp_matrix.workload.entry import fsdp_version, isolated_accelerate_state
from fsdp_matrix.workload.hf_trainer import trainer_fsdp_config, trainer_train_and_check, training_arguments
from fsdp_matrix.workload.knobs import knobs_of, trainer_kwargs
from fsdp_matrix.workload.models import DTYPES, VOCAB
from fsdp_matrix.workload.params import axis
from fsdp_matrix.workload.training import SEQ

TRAINERS = ("sft", "dpo", "grpo")
"""The TRL trainers this entry builds: ``sft`` (SFTTrainer), ``dpo`` (DPOTrainer), ``grpo`` (GRPOTrainer, TRL >= 0.14;
it generates its completions with the model being trained, through the FSDP-wrapped model, no vLLM)."""
SPECIALS = ("<pad>", "<s>", "</s>")
"""Token ids 0, 1, 2: pad, and the tiny Llama/Gemma configs' own bos (1) and eos (2)."""


def tiny_tokenizer() -> Any:
    """A fast tokenizer over the tiny models' VOCAB ids, built in code: ``<pad> <s> </s> t3 .. t127``, whitespace
    split. TRL needs a tokenizer; a hub one is out of reach here, and this one maps text to ids the models know."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({f"t{i}": i for i in range(len(SPECIALS), VOCAB)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<pad>"
    )


def _vocab_words(gen: torch.Generator, n: int) -> str:
    return " ".join(f"t{i}" for i in torch.randint(len(SPECIALS), VOCAB, (n,), generator=gen).tolist())


def tiny_dataset(trainer: str, rows: int, seed: int) -> Any:
    """``rows`` fixed random texts (the same on every rank): ``text`` for SFT, ``prompt``/``chosen``/``rejected``
    for DPO; a ``datasets.Dataset`` built in memory."""
    from datasets import Dataset

    gen = torch.Generator().manual_seed(seed)
    if trainer == "sft":
        return Dataset.from_dict({"text": [_vocab_words(gen, SEQ) for _ in range(rows)]})
    if trainer == "grpo":
        return Dataset.from_dict({"prompt": [_vocab_words(gen, SEQ // 2) for _ in range(rows)]})
    half = SEQ // 2
    columns: Dict[str, List[str]] = {"prompt": [], "chosen": [], "rejected": []}
    for _ in range(rows):
        columns["prompt"].append(_vocab_words(gen, half))
        columns["chosen"].append(_vocab_words(gen, half))
        columns["rejected"].append(_vocab_words(gen, half))
    return Dataset.from_dict(columns)


def token_sum_reward(completions: List[Any], **_: Any) -> List[float]:
    """GRPO's reward: the sum of the completion's token numbers (``t17 t3`` gives 20), scaled. Sampled completions
    differ, so the two of a prompt almost never tie and the advantages (and so the gradients) are not zero."""

    def text(completion: Any) -> str:
        # conversational datasets hand over a list of messages; this entry's prompts are plain text
        return completion if isinstance(completion, str) else " ".join(m["content"] for m in completion)

    return [sum(int(w[1:]) for w in text(c).split() if w[1:].isdigit()) / VOCAB for c in completions]


def trl_version() -> str:
    from importlib.metadata import version

    return version("trl")


def _fields(cls: type) -> set:
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()


def _classes(trainer: str) -> tuple:
    import trl

    if trainer == "sft":
        return trl.SFTTrainer, getattr(trl, "SFTConfig", None)
    if trainer == "grpo":
        return trl.GRPOTrainer, trl.GRPOConfig
    return trl.DPOTrainer, getattr(trl, "DPOConfig", None)


def _trl_options(trainer: str) -> Dict[str, Any]:
    """What the tiny data needs, by meaning; ``_place`` puts each under this release's name."""
    if trainer == "sft":
        return {"dataset_text_field": "text", "max_length": 4 * SEQ, "packing": False}
    if trainer == "grpo":
        # 2 completions per prompt: the global batch (2 ranks x 2) must be a multiple of it; 4 tokens each
        return {"num_generations": 2, "max_completion_length": 4}
    return {"max_length": 4 * SEQ, "max_prompt_length": 2 * SEQ}


def _place(options: Dict[str, Any], config_fields: set, trainer_params: set) -> tuple:
    """Split ``options`` into (config kwargs, trainer kwargs) under the names this TRL release has."""
    to_config: Dict[str, Any] = {}
    to_trainer: Dict[str, Any] = {}
    for name, value in options.items():
        names = (name, "max_seq_length") if name == "max_length" else (name,)
        for candidate in names:
            if candidate in config_fields:
                to_config[candidate] = value
                break
            if candidate in trainer_params:
                to_trainer[candidate] = value
                break
    return to_config, to_trainer


@contextlib.contextmanager
def trl_setup(
    model: nn.Module,
    peft_config: Any,
    params: Mapping[str, Any],
    ctx: RankContext,
    *,
    trainer: str = "sft",
    rows: int = 8,
    **overrides: Any,
) -> Iterator[Any]:
    """A TRL ``SFTTrainer``/``DPOTrainer`` over the base ``model`` with ``peft_config``, ``fsdp="full_shard
    auto_wrap"`` and the cell's ``fsdp_config`` (hf_trainer.trainer_fsdp_config) in its args; yields it.

    ``bf16`` follows the cell's ``dtype`` (TRL >= 0.20 turns it on by default; an fp32 cell stays fp32 on every
    release). ``overrides`` go to the trainer's config (TrainingArguments before TRL 0.9). On CPU the shim swaps
    in an Accelerator class that reaches FSDP (TRL's trainers build theirs through the transformers Trainer).
    """
    from transformers import TrainingArguments

    if trainer not in TRAINERS:
        raise ValueError(f"unknown TRL trainer {trainer!r} (expected one of {', '.join(TRAINERS)})")
    trainer_cls, config_cls = _classes(trainer)
    if config_cls is None and trainer == "dpo":
        raise RuntimeError(f"trl {trl_version()} has no DPOConfig: this entry builds DPO from TRL 0.9 on")
    config_cls = config_cls or TrainingArguments
    init = set(inspect.signature(trainer_cls.__init__).parameters)
    to_config, to_trainer = _place(_trl_options(trainer), _fields(config_cls), init)
    if trainer == "grpo":
        to_trainer["reward_funcs"] = token_sum_reward
    version = fsdp_version(params)
    with isolated_accelerate_state(), cpu_fsdp_shim(ctx.device, version, trainer=True) as shim:
        kwargs = training_arguments(
            ctx,
            str(ctx.scratch / f"trl-{trainer}"),
            bf16=axis(params, "dtype", tuple(DTYPES), default="fp32") == "bf16",
            fsdp_config=trainer_fsdp_config(model, params),
            **to_config,
        )
        kwargs.update(trainer_kwargs(knobs_of(params), ctx.device))
        kwargs.update(overrides)
        args = config_cls(**kwargs)
        tok = tiny_tokenizer()
        tok_kw = "processing_class" if "processing_class" in init else "tokenizer"
        built = trainer_cls(
            model=model,
            args=args,
            train_dataset=tiny_dataset(trainer, rows, ctx.seed),
            peft_config=peft_config,
            **{tok_kw: tok},
            **to_trainer,
        )
        built.fsdp_matrix_shim = shim
        try:
            yield built
        finally:
            built.accelerator.free_memory()
            del built


def trl_train_and_check(trainer: Any, params: Mapping[str, Any], ctx: RankContext) -> dict:
    """Train and judge as the ``trainer`` entry does (hf_trainer.trainer_train_and_check). The trainable set and the
    corruption checks' reference come from TRL's PEFT model before the Trainer wraps it."""
    built = {
        "adapter_dtypes": adapter_dtypes(trainer.model),
        "trl": trl_version(),
        "trl_trainer": type(trainer).__name__,
    }
    checks = trainer_train_and_check(trainer, params, ctx, trainable_names(trainer.model))
    return {**checks, **built, "entry": "trl"}


def trl_entry(
    model: nn.Module,
    peft_config: Any,
    params: Mapping[str, Any],
    ctx: RankContext,
    *,
    trainer: str = "sft",
    **overrides: Any,
) -> dict:
    """The ``trl`` entry of a cell: TRL applies ``peft_config`` to the base ``model``, trains 3 steps, checks.
    ``overrides`` go to the trainer's config (e.g. ``optim``)."""
    # the adapter's initial weights come from the global RNG: the same on every rank
    torch.manual_seed(ctx.seed)
    with trl_setup(model, peft_config, params, ctx, trainer=trainer, **overrides) as built:
        return trl_train_and_check(built, params, ctx)


def trl_entry_from_peft(model: nn.Module, params: Mapping[str, Any], ctx: RankContext) -> dict:
    """``wrap_and_train``'s ``trl`` entry for a repro that built a PEFT model: TRL takes a base model and a
    ``peft_config`` (and refuses a PeftModel together with one), so the adapter is taken off again
    (``unload()``, the base weights untouched) and its config handed to TRL's ``SFTTrainer``."""
    config = copy.deepcopy(model.peft_config[model.active_adapter])
    config.inference_mode = False
    return trl_entry(model.unload(), config, params, ctx)
