"""Checkpoint save paths through accelerate and the transformers Trainer (on CPU through the shim of cpu_shim.py),
and the two resume paths. The checks are in ``checkpoint``.

Resume paths train 2 steps, save, train step 3 (the uninterrupted run), then build a fresh model, resume from the
step-2 checkpoint and train step 3 again: on a fixed batch the two must agree (``check_resumed``). Every adapter
file in the checkpoint is also checked for its full shapes, which names the tensor when a slice was saved.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Mapping, Tuple
from unittest import mock

import torch
from torch import nn

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.checkpoint import (
    Saved,
    check_restored,
    check_resumed,
    check_saved,
    gathered_adapter,
    logits,
    on_every_rank,
    optimizer_digest,
    read_adapter_dir,
    read_checkpoint_dir,
    read_file,
    reload_and_check,
)
from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.entry import accelerate_setup, fsdp_version, require_wrapper
from fsdp_matrix.workload.hf_trainer import trainer_setup, trainer_train_and_check
from fsdp_matrix.workload.params import axis
from fsdp_matrix.workload.training import synthetic_batch, train_and_check

STATE_DICT_TYPES = {"full": "FULL_STATE_DICT", "sharded": "SHARDED_STATE_DICT"}
"""The ``sdt`` axis values of matrix.yaml and the FSDP state dict types they name."""

HF_SAVES = ("acc_get_state_dict", "acc_save_model", "acc_save_state", "trainer_save_model", "trainer_resume")
"""The ``save`` axis values that go through accelerate or the Trainer."""

Builders = Tuple[Callable[[], nn.Module], Callable[[], nn.Module]]


@contextlib.contextmanager
def state_dict_type_env(sdt: str) -> Iterator[str]:
    """``FSDP_STATE_DICT_TYPE`` for the block, as an accelerate config file sets it: accelerate builds the plugin
    from env for transformers 4.x (which passes no plugin), and transformers 5.3.0 ignores ``fsdp_config``'s
    ``state_dict_type`` (observed). Yields the type's name for ``fsdp_config``."""
    name = STATE_DICT_TYPES[sdt]
    with mock.patch.dict(os.environ, {"FSDP_STATE_DICT_TYPE": name}):
        yield name


@contextlib.contextmanager
def trusted_torch_load() -> Iterator[None]:
    """``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` for a resume: transformers before the fix of its #34631 loads its own
    ``rng_state_*.pth`` with ``torch.load(path)``, which torch >= 2.6 refuses (``UnpicklingError: Weights only load
    failed``, in ``Trainer._load_rng_state``, not FSDP code). The variable only affects calls that pass no
    ``weights_only``, so releases that pass it are unaffected; the files are this cell's own."""
    with mock.patch.dict(os.environ, {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}):
        yield


def require_state_dict_type(plugin: Any, name: str) -> None:
    """The plugin in force uses the state dict type the cell is about; else the cell would test another path."""
    got = str(getattr(plugin, "state_dict_type", None))
    if not got.endswith(name):
        raise RuntimeError(f"the FSDP plugin in force has state_dict_type {got}, the cell is {name}")


def _one_step(setup: Any, ctx: Any, trainable: list, steps: int = 1) -> dict:
    acc = setup.accelerator
    return train_and_check(
        setup.model, ctx, steps=steps, trainable=trainable, optimizer=setup.optimizer, backward=acc.backward
    )


def read_model_file(out: Path) -> Saved:
    """The single model file ``accelerator.save_model`` wrote (safetensors, or ``.bin`` in older releases)."""
    files = sorted(p for p in out.iterdir() if p.suffix in (".safetensors", ".bin"))
    if len(files) != 1:
        raise CheckFailed(f"save_model wrote {[p.name for p in files]}, expected one model file")
    return read_file(files[0])


def load_model_file(build_peft: Callable[[], nn.Module], out: Path) -> nn.Module:
    """A fresh PEFT model with ``save_model``'s full state dict loaded (``load_state_dict(strict=False)``)."""
    files = [p for p in out.iterdir() if p.suffix in (".safetensors", ".bin")]
    if files[0].suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(files[0]))
    else:
        state = torch.load(str(files[0]), map_location="cpu", weights_only=True)
    fresh = build_peft()
    fresh.load_state_dict(state, strict=False)
    return fresh


def accelerate_roundtrip(
    save: str, params: Mapping[str, Any], ctx: Any, out: Path, builders: Builders, expected: Mapping, dtype: Any
) -> dict:
    """``acc_get_state_dict``: ``unwrap_model(model).save_pretrained(..., state_dict=accelerator.get_state_dict(
    model))`` (accelerate's documented pattern); ``acc_save_model``: ``accelerator.save_model``. Reload, check."""
    build_base, build_peft = builders
    model = build_peft()
    trainable = trainable_names(model)
    batch = synthetic_batch(ctx)
    with accelerate_setup(model, params, ctx, saves=True) as setup:
        acc = setup.accelerator
        checks = {**setup.checks(), **_one_step(setup, ctx, trainable, steps=3)}
        trained = gathered_adapter(setup.model)
        fsdp_logits = logits(setup.model, batch)
        if save == "acc_get_state_dict":
            state = acc.get_state_dict(setup.model)
            unwrapped = acc.unwrap_model(setup.model)
            on_every_rank(
                lambda: unwrapped.save_pretrained(
                    str(out), is_main_process=acc.is_main_process, state_dict=state, save_function=acc.save
                )
            )
        else:
            acc.save_model(setup.model, str(out))
            on_every_rank(lambda: None)
    untrained = logits(build_peft(), batch)

    def check() -> dict:
        if save == "acc_get_state_dict":
            saved = read_adapter_dir(out)
            from peft import PeftModel

            reload = lambda: PeftModel.from_pretrained(build_base(), str(out))  # noqa: E731
        else:
            saved, reload = read_model_file(out), lambda: load_model_file(build_peft, out)
        return reload_and_check(saved, reload, expected, trained, fsdp_logits, batch, dtype, untrained)

    return {**checks, **on_every_rank(check)}


def accelerate_resume(
    params: Mapping[str, Any], ctx: Any, out: Path, builders: Builders, expected: Mapping, dtype: Any
) -> dict:
    """``accelerator.save_state`` after step 2, then ``load_state`` into a freshly prepared model and optimizer.

    The state dict type comes from ``FSDP_STATE_DICT_TYPE``, as an accelerate config file sets it (accelerate <= 0.29
    takes no string for the plugin's ``state_dict_type`` argument: observed ``KeyError: 'FULL_STATE_DICT'``).
    """
    _, build_peft = builders
    model = build_peft()
    trainable = trainable_names(model)
    start = gathered_adapter(model)
    with state_dict_type_env(axis(params, "sdt", tuple(STATE_DICT_TYPES))) as sdt:
        with accelerate_setup(model, params, ctx, saves=True) as setup:
            require_state_dict_type(setup.plugin, sdt)
            checks = {**setup.checks(), **_one_step(setup, ctx, trainable, steps=2)}
            setup.accelerator.save_state(str(out))
            at_save = gathered_adapter(setup.model)
            saved_digest = optimizer_digest(setup.optimizer)
            _one_step(setup, ctx, trainable)
            uninterrupted = gathered_adapter(setup.model)
        with accelerate_setup(build_peft(), params, ctx, saves=True) as setup:
            with trusted_torch_load():
                setup.accelerator.load_state(str(out))
            restored = gathered_adapter(setup.model)
            loaded_digest = optimizer_digest(setup.optimizer)
            _one_step(setup, ctx, trainable)
            resumed = gathered_adapter(setup.model)
    files = on_every_rank(lambda: [check_saved(s, expected, at_save) for s in read_checkpoint_dir(out)])
    checks.update(check_restored(restored, at_save, (saved_digest, loaded_digest)))
    return {
        **checks,
        "checkpoint_files": [f["saved_where"] for f in files],
        **check_resumed(resumed, uninterrupted, start, dtype),
    }


def trainer_roundtrip(
    params: Mapping[str, Any], ctx: Any, out: Path, builders: Builders, expected: Mapping, dtype: Any
) -> dict:
    """``trainer.train()`` then ``trainer.save_model(dir)`` (FULL_STATE_DICT, which save_model needs); the adapter
    directory is reloaded with ``PeftModel.from_pretrained`` on a fresh base."""
    from peft import PeftModel

    build_base, build_peft = builders
    model = build_peft()
    trainable = trainable_names(model)
    batch = synthetic_batch(ctx)
    with state_dict_type_env("full") as sdt:
        with trainer_setup(
            model, params, ctx, output_dir=str(out / "run"), fsdp_config={"state_dict_type": sdt}, saves=True
        ) as trainer:
            require_state_dict_type(getattr(trainer.accelerator.state, "fsdp_plugin", None), sdt)
            checks = trainer_train_and_check(trainer, params, ctx, trainable)
            trained = gathered_adapter(trainer.model_wrapped)
            fsdp_logits = logits(trainer.model_wrapped, batch)
            trainer.save_model(str(out / "final"))
            on_every_rank(lambda: None)
    untrained = logits(build_peft(), batch)

    def check() -> dict:
        saved = read_adapter_dir(out / "final")
        reload = lambda: PeftModel.from_pretrained(build_base(), str(out / "final"))  # noqa: E731
        return reload_and_check(saved, reload, expected, trained, fsdp_logits, batch, dtype, untrained)

    return {**checks, **on_every_rank(check)}


def trainer_resume(
    params: Mapping[str, Any], ctx: Any, out: Path, builders: Builders, expected: Mapping, dtype: Any
) -> dict:
    """Run 1: 3 steps with a checkpoint at step 2 (``save_steps=2``). Run 2: a fresh model and Trainer,
    ``train(resume_from_checkpoint=checkpoint-2)``. Every adapter file in checkpoint-2 must have full shapes, and
    run 2's adapter after step 3 must match run 1's."""
    _, build_peft = builders
    model = build_peft()
    trainable = trainable_names(model)
    start = gathered_adapter(model)
    save_args: Dict[str, Any] = dict(save_strategy="steps", save_steps=2, saves=True)
    with state_dict_type_env(axis(params, "sdt", tuple(STATE_DICT_TYPES))) as sdt:
        config = {"state_dict_type": sdt}
        with trainer_setup(
            model, params, ctx, output_dir=str(out / "run1"), fsdp_config=config, **save_args
        ) as trainer:
            require_state_dict_type(getattr(trainer.accelerator.state, "fsdp_plugin", None), sdt)
            checks = trainer_train_and_check(trainer, params, ctx, trainable)
            uninterrupted = gathered_adapter(trainer.model_wrapped)
        with trainer_setup(
            build_peft(), params, ctx, output_dir=str(out / "run2"), fsdp_config=config, **save_args
        ) as trainer:
            with trusted_torch_load():
                trainer.train(resume_from_checkpoint=str(out / "run1" / "checkpoint-2"))
            require_wrapper(trainer.model_wrapped, fsdp_version(params))
            resumed = gathered_adapter(trainer.model_wrapped)
            steps = trainer.state.global_step
    files = on_every_rank(
        lambda: [check_saved(s, expected) for s in read_checkpoint_dir(out / "run1" / "checkpoint-2")]
    )
    if steps != 3:
        raise CheckFailed(f"the resumed Trainer ended at global step {steps}, not 3")
    return {
        **checks,
        "checkpoint_files": [f["saved_where"] for f in files],
        **check_resumed(resumed, uninterrupted, start, dtype),
    }


def hf_roundtrip(
    save: str, params: Mapping[str, Any], ctx: Any, out: Path, builders: Builders, expected: Mapping, dtype: Any
) -> dict:
    """Dispatch one of ``HF_SAVES``; the model is built (and trained) inside, through accelerate or the Trainer."""
    if save in ("acc_get_state_dict", "acc_save_model"):
        return accelerate_roundtrip(save, params, ctx, out, builders, expected, dtype)
    if save == "acc_save_state":
        return accelerate_resume(params, ctx, out, builders, expected, dtype)
    if save == "trainer_save_model":
        return trainer_roundtrip(params, ctx, out, builders, expected, dtype)
    if save == "trainer_resume":
        return trainer_resume(params, ctx, out, builders, expected, dtype)
    raise ValueError(f"unknown save path {save!r} (expected one of {', '.join(HF_SAVES)})")
