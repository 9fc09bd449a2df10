"""The ``trainer`` entry: a transformers ``Trainer`` with ``fsdp=`` / ``fsdp_config`` as users write them.

``trainer_setup`` builds the Trainer (a tiny in-memory dataset, ``max_steps=3``) and yields it; the Trainer wraps the
model itself inside ``train()``. ``trainer_train_and_check`` trains it and judges the result with the same checks as
every other cell: the per-tensor gradients are read from a pre-step hook on the Trainer's own optimizer, the
losses from its log.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Mapping, Optional

import torch
from torch import distributed as dist
from torch import nn

from fsdp_matrix.workload.activation import ac_fsdp_config
from fsdp_matrix.workload.checks import TrainingChecks, trainable_names
from fsdp_matrix.workload.collectives import CollectiveSpy, fsdp_unit_modules
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.corruption import CorruptionChecks, Reference
from fsdp_matrix.workload.cpu_shim import cpu_fsdp_shim
from fsdp_matrix.workload.entry import (
    entry_mixed_precision,
    fsdp_units,
    fsdp_version,
    isolated_accelerate_state,
    plugin_summary,
    require_wrapper,
)
from fsdp_matrix.workload.knobs import CompileProbe, knobs_of, trainer_kwargs
from fsdp_matrix.workload.meta_init import cpu_sync_module_states, ram_efficient, reference_for
from fsdp_matrix.workload.models import VOCAB, decoder_layer_class
from fsdp_matrix.workload.params import axis, flag
from fsdp_matrix.workload.training import SEQ, judge_collectives, synthetic_batch
from fsdp_matrix.workload.wrapping import WRAPS


class TokenRows(torch.utils.data.Dataset):
    """``rows`` fixed random token sequences (the same on every rank), each its own label: a causal-LM dataset."""

    def __init__(self, rows: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (rows, SEQ), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i], "attention_mask": torch.ones_like(self.ids[i])}


def trainer_fsdp_config(model: nn.Module, params: Mapping[str, Any]) -> Dict[str, Any]:
    """``fsdp_config`` for the cell's ``wrap``/``orig`` axes, as a user writes it.

    The decoder-layer class to wrap (left out for a model that has none, e.g. the tiny nets of tinynets.py, as
    their user would), ``use_orig_params``, ``version`` (transformers 5.x defaults to 2; older releases
    ignore the key and build FSDP1), and ``sync_module_states`` false (transformers' default true makes accelerate
    refuse a CPU-only machine: "There are currently no available devices found"; every rank builds identical
    weights, so nothing needs syncing). ``peft_policy`` cannot be asked for: for a PEFT model the Trainer puts PEFT's
    own policy in place of the user's FSDP1 policy (transformers >= 4.38, observed).
    """
    if axis(params, "wrap", WRAPS) == "peft_policy":
        raise ValueError("the Trainer has no setting for PEFT's policy: use wrap decoder_layer (it swaps PEFT's in)")
    config: Dict[str, Any] = {
        "version": fsdp_version(params),
        # also for FSDP2 cells: a transformers that ignores "version" builds FSDP1, and the cell must then fail on
        # the wrapper it got, not on the CPU-only refusal
        "sync_module_states": "false",
    }
    if ram_efficient(params):
        # as PEFT's own FSDP configs (examples/sft/configs/fsdp_config.yaml) write it
        config.update(cpu_ram_efficient_loading="true", sync_module_states="true")
    if fsdp_version(params) == 1:
        config["use_orig_params"] = str(flag(params, "orig")).lower()
    if any(type(m).__name__.endswith("DecoderLayer") for m in model.modules()):
        config["transformer_layer_cls_to_wrap"] = [decoder_layer_class(model).__name__]
    config.update(ac_fsdp_config(params))  # ac fsdp: accelerate's checkpointing, through the Trainer
    return config


def training_arguments(ctx: RankContext, output_dir: str, **more: Any) -> Dict[str, Any]:
    """The Trainer's arguments every cell trains with (3 steps, no saving, no reporting), FSDP as users turn it on
    (``fsdp="full_shard auto_wrap"``, plus ``more``'s ``fsdp_config``), on the CPU where the cell runs there. The
    TRL entry builds its config from the same (trl_trainer.py)."""
    kwargs: Dict[str, Any] = dict(
        output_dir=output_dir,
        per_device_train_batch_size=2,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=ctx.seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
        fsdp="full_shard auto_wrap",
        **more,
    )
    if ctx.device.type == "cpu":
        kwargs["use_cpu"] = True
    return kwargs


@contextlib.contextmanager
def trainer_setup(
    model: nn.Module,
    params: Mapping[str, Any],
    ctx: RankContext,
    *,
    output_dir: Optional[str] = None,
    fsdp_config: Optional[Dict[str, Any]] = None,
    rows: int = 8,
    saves: bool = False,
    **overrides: Any,
) -> Iterator[Any]:
    """A ``Trainer`` over ``model`` with ``fsdp="full_shard auto_wrap"`` and the cell's ``fsdp_config``; yields it.

    ``fsdp_config`` extends the cell's (e.g. ``state_dict_type``); ``overrides`` go to ``TrainingArguments`` (e.g.
    ``save_strategy``, ``save_steps``). On CPU the shim swaps in an Accelerator class that reaches FSDP (the Trainer
    builds its own Accelerator); its record is ``trainer.fsdp_matrix_shim``. ``saves``: the Trainer will save
    checkpoints (adds part (D) of the shim; give ``save_strategy`` etc. in ``overrides``).
    """
    from transformers import Trainer, TrainingArguments

    version = fsdp_version(params)
    shim_on = cpu_fsdp_shim(ctx.device, version, trainer=True, saves=saves, ram_efficient=ram_efficient(params))
    with isolated_accelerate_state(), shim_on as shim:
        kwargs = training_arguments(
            ctx,
            output_dir or str((ctx.shared or ctx.scratch) / "trainer"),
            remove_unused_columns=False,
            fsdp_config={**trainer_fsdp_config(model, params), **(fsdp_config or {})},
        )
        kwargs.update(trainer_kwargs(knobs_of(params), ctx.device))
        if entry_mixed_precision(params) != "no":
            kwargs[entry_mixed_precision(params)] = True  # TrainingArguments(bf16=True), as users turn it on
        kwargs.update(overrides)
        args = TrainingArguments(**kwargs)
        trainer = Trainer(model=model, args=args, train_dataset=TokenRows(rows, ctx.seed))
        trainer.fsdp_matrix_shim = shim
        try:
            yield trainer
        finally:
            trainer.accelerator.free_memory()
            del trainer


class _GradProbe:
    """Reads per-tensor gradients from a pre-step hook on the Trainer's optimizer (after clipping, before the step),
    runs the after-wrapping corruption checks once the Trainer has wrapped the model, and closes the collectives
    spy's count at each optimizer step (its unit names taken from the wrapped model)."""

    def __init__(self, judge: TrainingChecks, trainer: Any, guard: CorruptionChecks, spy: CollectiveSpy) -> None:
        self.judge, self.trainer, self.guard, self.spy, self.handles = judge, trainer, guard, spy, []

    def attach(self, optimizer: Any) -> None:
        self.guard.after_wrap(self.trainer.model_wrapped)
        units = fsdp_unit_modules(self.trainer.model_wrapped)
        self.spy.names.update({id(m): name for name, (m, _, _) in units.items()})
        self.spy.current.clear()  # what came before the first step is the Trainer's setup, not a step's
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps torch's
        self.handles = [
            inner.register_step_pre_hook(lambda *_: self._record()),
            inner.register_step_post_hook(lambda *_: self.spy.step()),
        ]

    def _record(self) -> None:
        with self.spy.paused():
            self.judge.record_grads(self.trainer.model_wrapped)

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()


def _callback(probe: _GradProbe) -> Any:
    from transformers import TrainerCallback

    class AttachGradProbe(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
            if optimizer is None:
                raise RuntimeError("the Trainer gave its callbacks no optimizer at on_train_begin")
            probe.attach(optimizer)

    return AttachGradProbe()


def entry_settings(trainer: Any) -> Dict[str, Any]:
    """The Trainer's mixed precision (its ``bf16``/``fp16`` arguments, as its Accelerator holds them) and its
    ``gradient_checkpointing`` argument, for the structural and dtype checks (corruption.CorruptionChecks)."""
    return {
        "mixed_precision": str(trainer.accelerator.mixed_precision),
        "checkpointing": bool(getattr(trainer.args, "gradient_checkpointing", False)),
    }


def trainer_train_and_check(
    trainer: Any,
    params: Mapping[str, Any],
    ctx: RankContext,
    trainable: List[str],
    reference: Optional[Reference] = None,
) -> dict:
    """``trainer.train()`` (the Trainer wraps the model), then the checks of every cell on ``trainer.model_wrapped``.

    The snapshot is of the bare PEFT model before training; the model the Trainer trained must be the FSDP version the
    cell asked for. The corruption checks' ``reference`` is taken from the bare model when not given; their sharding
    and forward checks run at ``on_train_begin``, after the Trainer wrapped the model. ``init`` ``ram_efficient``:
    ranks > 0 hold meta tensors until the Trainer wraps, so the reference and the snapshot are rank 0's, broadcast.
    """
    batch = synthetic_batch(ctx)
    low_mem = ram_efficient(params)
    if reference is None:
        reference = reference_for(trainer.model, batch, ctx, params)
    judge = TrainingChecks(trainable, ctx.device, ctx.world_size)
    if low_mem and dist.is_initialized():
        # ranks > 0 hold meta tensors before the Trainer wraps: every rank judges against rank 0's weights
        box = [None]
        if ctx.is_main:
            judge.snapshot(trainer.model)
            box = [judge.before]
        dist.broadcast_object_list(box, src=0)
        judge.before = box[0]
    else:
        judge.snapshot(trainer.model)
    guard = CorruptionChecks(trainable, ctx.world_size, reference, batch, params, entry_settings(trainer))
    spy, compiled = CollectiveSpy(), CompileProbe.start(knobs_of(params))  # the Trainer compiles inside train()
    probe = _GradProbe(judge, trainer, guard, spy)
    trainer.add_callback(_callback(probe))
    try:
        # FSDP1's sync_module_states runs inside train(), where the Trainer wraps the model
        lifted = cpu_sync_module_states(ctx.device) if low_mem and fsdp_version(params) == 1 else None
        with lifted or contextlib.nullcontext([]) as lines, spy.spying():
            trainer.train()
        for line in lines:
            trainer.fsdp_matrix_shim.note(line)
    finally:
        probe.detach()
    judge.losses = [float(h["loss"]) for h in trainer.state.log_history if "loss" in h]
    wrapped = trainer.model_wrapped
    state = trainer.accelerator.state
    checks = {
        "entry": "trainer",
        "distributed_type": getattr(trainer.accelerator, "chosen_by_accelerate", str(state.distributed_type)),
        "plugin": plugin_summary(getattr(state, "fsdp_plugin", None)),
        "fsdp_units": fsdp_units(wrapped),
        "shim": list(trainer.fsdp_matrix_shim.applied),
        "global_step": trainer.state.global_step,
    }
    require_wrapper(wrapped, fsdp_version(params))
    found, failures = guard.after_training(wrapped, trainer.optimizer)
    units = fsdp_unit_modules(wrapped)
    counted, broken = judge_collectives(spy, units, wrapped, params, ctx.world_size, knobs_of(params).accum)
    frames, uncompiled = compiled.judge()
    failures += [*broken, *uncompiled]
    return judge.finish(wrapped, {**checks, **found, **frames, "collectives": counted}, failures)


def trainer_entry(
    model: nn.Module,
    params: Mapping[str, Any],
    ctx: RankContext,
    trainable: Optional[List[str]] = None,
    reference: Optional[Reference] = None,
    **setup: Any,
) -> dict:
    """The ``trainer`` entry of a cell: build the Trainer (``setup``: ``trainer_setup``'s keywords, e.g.
    ``fsdp_config`` or ``TrainingArguments`` overrides), train, check. ``trainable`` is read from ``model`` when not
    given."""
    trainable = trainable_names(model) if trainable is None else trainable
    with trainer_setup(model, params, ctx, **setup) as trainer:
        return trainer_train_and_check(trainer, params, ctx, trainable, reference)
