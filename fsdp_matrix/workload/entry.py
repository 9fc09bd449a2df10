"""How the user reaches FSDP: the ``entry`` axis of matrix.yaml.

- ``torch`` (a cell without ``entry``): ``FullyShardedDataParallel`` / ``fully_shard`` called directly
  (wrapping.py).
- ``accelerate``: ``Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(...))`` and ``accelerator.prepare``,
  with the plugin's own settings. Under ``accelerate launch --config_file <fsdp yaml>`` the plugin comes from the
  launcher's environment instead, as in a launched user script (``Accelerator()``).
- ``trainer``: a transformers ``Trainer`` with ``fsdp=`` / ``fsdp_config`` as users write them (hf_trainer.py).
- ``trl``: TRL's ``SFTTrainer`` / ``DPOTrainer`` with ``peft_config`` and the same ``fsdp`` args (trl_trainer.py).

The setup functions are context managers that yield the prepared objects and clean up after the block, so other
code (training checks, checkpoint round trips) can reuse them: ``accelerate_setup`` yields an ``AccelerateSetup``
(accelerator, prepared model and optimizer). Each setup resets accelerate's process-wide state before and after,
restores the environment, and on CPU applies the shim of cpu_shim.py (recorded in ``checks["shim"]``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional
from unittest import mock

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import FullyShardedDataParallelPlugin
from peft.utils.other import fsdp_auto_wrap_policy
from torch import nn
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.activation import ac_plugin_kwargs, enable_hf_ac
from fsdp_matrix.workload.checks import wrapper_kind
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.corruption import Reference
from fsdp_matrix.workload.cpu_shim import CpuFsdpAccelerator, ShimRecord, cpu_fsdp_shim, force_fsdp
from fsdp_matrix.workload.knobs import Loop, accelerate_kwargs, knobs_of
from fsdp_matrix.workload.meta_init import cpu_sync_module_states, ram_efficient, reference_for
from fsdp_matrix.workload.models import decoder_layer_class
from fsdp_matrix.workload.params import UnknownAxisValue, axis, flag
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.wrapping import MIXED_PRECISION, WRAPS

ENTRIES = ("torch", "accelerate", "trainer", "trl")
"""The entry axis values of matrix.yaml; a cell without the axis is ``torch``."""
LAUNCHED = "ACCELERATE_USE_FSDP"
"""Set to ``true`` by ``accelerate launch`` with an FSDP config (and by transformers 4.x TrainingArguments)."""
LAYER_CLS = ("name", "partial")
"""The ``layer_cls`` axis: how the accelerate entry's plugin names the decoder layer class to wrap, by name
(``transformer_cls_names_to_wrap``, as ``accelerate config`` writes it; a cell without the axis) or as a
``functools.partial`` of torch's ``transformer_auto_wrap_policy``."""


def fsdp_version(params: Mapping[str, Any]) -> int:
    """2 for the ``fsdp2`` wrap axis value, else 1."""
    return 2 if accelerate_wrap(params) == "fsdp2" else 1


def accelerate_wrap(params: Mapping[str, Any]) -> str:
    """The cell's ``wrap`` as the accelerate entry builds it: accelerate's plugin wraps by a policy, so ``root``,
    ``root_only`` and ``fsdp2_root`` (one unit, the root) are not among its values. A cell pairing one with the
    accelerate entry is refused in one line that says so (it blamed "this repro")."""
    value = params.get("wrap")
    if value is None or value in WRAPS:
        return axis(params, "wrap", WRAPS)
    raise UnknownAxisValue(
        f"axis 'wrap': the accelerate entry does not build {value!r} (it takes: {', '.join(WRAPS)}); pair "
        f"{value!r} with entry: torch, or pass accelerate_setup(..., plugin=...) a plugin of your own"
    )


def require_wrapper(model: nn.Module, version: int) -> str:
    """The wrapper kind, which must be the FSDP version the cell asked for; CheckFailed naming what it got.

    accelerate and the Trainer fall back silently (DDP on CPU, no wrapper without ``cpu=True``, FSDP1 when a
    transformers release ignores ``fsdp_config["version"]``): such a cell must fail, never pass.
    """
    kind = wrapper_kind(model)
    if kind != f"fsdp{version}":
        raise CheckFailed(f"model is {type(model).__name__} ({kind}), not FSDP{version}")
    return kind


def fsdp_units(model: nn.Module) -> int:
    """Number of FSDP1 units, or of FSDP2 ``fully_shard`` modules."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import FSDPModule
    return sum(isinstance(m, (FullyShardedDataParallel, FSDPModule)) for m in model.modules())


@contextlib.contextmanager
def isolated_accelerate_state() -> Iterator[None]:
    """A cell's accelerate state starts empty and leaves nothing behind: accelerate keeps its state (device,
    distributed type, FSDP plugin, dataloaders) in process-wide singletons, and the Trainer and accelerate both
    export settings to ``os.environ``; a batched launch runs many cells in one process."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    try:
        with mock.patch.dict(os.environ):  # restores the whole environment as it was
            yield
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


def _plugin_fields() -> set:
    return {f.name for f in dataclasses.fields(FullyShardedDataParallelPlugin)}


def make_plugin(
    model: nn.Module, params: Mapping[str, Any], state_dict_type: Optional[str] = None
) -> FullyShardedDataParallelPlugin:
    """``FullyShardedDataParallelPlugin`` for the cell's ``wrap``/``orig`` axes, as a user of this accelerate writes it.

    ``decoder_layer``/``fsdp2``: accelerate's transformer-based policy on the decoder-layer class; ``peft_policy``:
    PEFT's ``fsdp_auto_wrap_policy(model)``. ``fsdp_version`` is passed when the plugin has it, and for FSDP2 also
    when it has not (accelerate < 1.6 then raises its TypeError). accelerate <= 0.29 reads ``use_orig_params`` and
    ``sync_module_states`` only from ``FSDP_*`` env (its ``__post_init__`` overwrites the arguments), and takes a
    string policy only from env: those are exported too, as ``accelerate config`` would.

    ``init`` ``ram_efficient``: ``cpu_ram_efficient_loading=True`` (FSDP1 also ``sync_module_states=True``), as PEFT's
    own FSDP configs set them; on CPU this needs part (E) of the shim.
    """
    version, fields = fsdp_version(params), _plugin_fields()
    low_mem = ram_efficient(params)
    kwargs: Dict[str, Any] = {}
    if version == 2 or "fsdp_version" in fields:
        kwargs["fsdp_version"] = version
    if low_mem:
        # accelerate 0.29 has no such field: there only the env (read by transformers) and sync_module_states say it
        if "cpu_ram_efficient_loading" in fields:
            kwargs["cpu_ram_efficient_loading"] = True
        os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "true"
    if version == 1:
        orig = flag(params, "orig")
        # full init: sync_module_states=True refuses a CPU-only machine, and every rank builds identical weights
        kwargs.update(use_orig_params=orig, sync_module_states=low_mem)
        os.environ["FSDP_USE_ORIG_PARAMS"] = str(orig).lower()
        os.environ["FSDP_SYNC_MODULE_STATES"] = str(low_mem).lower()
    if state_dict_type is not None:
        kwargs["state_dict_type"] = state_dict_type
    kwargs.update(ac_plugin_kwargs(params, fields))
    if accelerate_wrap(params) == "peft_policy":
        kwargs["auto_wrap_policy"] = fsdp_auto_wrap_policy(model)
    elif axis(params, "layer_cls", LAYER_CLS, default="name") == "partial":
        # the policy function with its layer set bound, as FSDP1 scripts and torch's FSDP docs write it
        layer = decoder_layer_class(model)
        kwargs["auto_wrap_policy"] = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer})
    elif "transformer_cls_names_to_wrap" in fields:
        layer = decoder_layer_class(model).__name__
        kwargs.update(auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=[layer])
    else:
        os.environ["FSDP_AUTO_WRAP_POLICY"] = "TRANSFORMER_BASED_WRAP"
        os.environ["FSDP_TRANSFORMER_CLS_TO_WRAP"] = decoder_layer_class(model).__name__
    plugin = FullyShardedDataParallelPlugin(**kwargs)
    if version == 1 and plugin.use_orig_params != flag(params, "orig"):
        raise RuntimeError(f"accelerate's plugin has use_orig_params={plugin.use_orig_params}, not {params['orig']}")
    if "activation_checkpointing" in kwargs and plugin.activation_checkpointing is not True:
        raise RuntimeError(f"accelerate's plugin has activation_checkpointing={plugin.activation_checkpointing}")
    return plugin


def plugin_summary(plugin: Optional[FullyShardedDataParallelPlugin]) -> Dict[str, Any]:
    """The plugin settings that decide what is under test, for ``checks["plugin"]``."""
    if plugin is None:
        return {}
    policy = plugin.auto_wrap_policy
    name = getattr(getattr(policy, "func", policy), "__name__", str(policy))
    return {
        "fsdp_version": getattr(plugin, "fsdp_version", 1),
        "use_orig_params": getattr(plugin, "use_orig_params", None),
        "auto_wrap_policy": name,
        "state_dict_type": str(getattr(plugin, "state_dict_type", None)),
        "activation_checkpointing": getattr(plugin, "activation_checkpointing", None),
    }


@dataclass
class AccelerateSetup:
    """What ``accelerate_setup`` prepared; valid inside its ``with`` block."""

    accelerator: Accelerator
    """The Accelerator; its state says FSDP (on CPU through the shim)."""
    model: nn.Module
    """The prepared model: FullyShardedDataParallel (FSDP1) or the same module with DTensor parameters (FSDP2)."""
    optimizer: Any
    """The prepared AdamW over the trainable parameters (accelerate's AcceleratedOptimizer)."""
    plugin: Optional[FullyShardedDataParallelPlugin]
    """The FSDP plugin in force (built by the cell, or from the launcher's env)."""
    shim: ShimRecord
    """What the CPU shim applied (nothing on GPU)."""
    launcher: str
    """``python`` (the plugin passed to ``Accelerator``) or ``accelerate launch`` (plugin from the launcher's env)."""
    distributed_type: str
    """accelerate's own choice before the shim, e.g. ``DistributedType.MULTI_CPU`` on CPU."""

    def checks(self) -> Dict[str, Any]:
        """What the cell records about how it reached FSDP."""
        return {
            "entry": "accelerate",
            "launcher": self.launcher,
            "distributed_type": self.distributed_type,
            "plugin": plugin_summary(self.plugin),
            "fsdp_units": fsdp_units(self.model),
            "shim": list(self.shim.applied),
        }


@contextlib.contextmanager
def accelerate_setup(
    model: nn.Module,
    params: Mapping[str, Any],
    ctx: RankContext,
    *,
    state_dict_type: Optional[str] = None,
    mixed_precision: str = "no",
    lr: float = 1e-2,
    saves: bool = False,
    plugin: Optional[FullyShardedDataParallelPlugin] = None,
) -> Iterator[AccelerateSetup]:
    """Prepare ``model`` and an AdamW through accelerate for the cell's ``wrap``/``orig`` axes; yield them.

    ``saves``: the block saves FSDP1 state dicts (adds part (D) of the CPU shim). ``plugin``: a plugin of your own
    (a size-based wrap, mixed precision, ...), used as given instead of the one the cell's axes build; its
    ``fsdp_version`` must still be the ``wrap`` axis's (docs/pages/entries.md).
    Raises CheckFailed when the prepared model is not the FSDP version asked for. FSDP2 prepares model and
    optimizer together (accelerate requires it); FSDP1 prepares the model first and builds the optimizer on the
    wrapped parameters (needed for use_orig_params=False).
    """
    version = fsdp_version(params)
    launched = os.environ.get(LAUNCHED, "false").lower() == "true"
    shim_on = cpu_fsdp_shim(ctx.device, version, saves=saves, ram_efficient=ram_efficient(params))
    with isolated_accelerate_state(), shim_on as shim:
        knobbed = accelerate_kwargs(knobs_of(params), ctx.device)
        if launched:
            # a launched script: Accelerator() with everything from the launcher's env (cpu from ACCELERATE_USE_CPU)
            accelerator = CpuFsdpAccelerator(**knobbed) if shim.active else Accelerator(**knobbed)
            plugin = getattr(accelerator.state, "fsdp_plugin", None)
            _check_launched_plugin(plugin, params)
            chosen = getattr(accelerator, "chosen_by_accelerate", str(accelerator.state.distributed_type))
        else:
            plugin = make_plugin(model, params, state_dict_type) if plugin is None else plugin
            cpu = ctx.device.type == "cpu"
            accelerator = Accelerator(fsdp_plugin=plugin, cpu=cpu, mixed_precision=mixed_precision, **knobbed)
            chosen = str(accelerator.state.distributed_type)
            force_fsdp(accelerator, plugin)
        enable_hf_ac(model, params)  # ac hf_*: on the PEFT model before prepare, as its user calls it
        trainable = [p for p in model.parameters() if p.requires_grad]
        if version == 2:
            prepared, optimizer = accelerator.prepare(model, torch.optim.AdamW(trainable, lr=lr))
        else:
            with cpu_sync_module_states(ctx.device) if ram_efficient(params) else contextlib.nullcontext([]) as lines:
                prepared = accelerator.prepare(model)
            for line in lines:
                shim.note(line)
            params_now = [p for p in prepared.parameters() if p.requires_grad]
            optimizer = accelerator.prepare(torch.optim.AdamW(params_now, lr=lr))
        setup = AccelerateSetup(
            accelerator, prepared, optimizer, plugin, shim, "accelerate launch" if launched else "python", chosen
        )
        try:
            require_wrapper(prepared, version)
            yield setup
        finally:
            accelerator.free_memory()
            del setup, prepared, optimizer


def _check_launched_plugin(plugin: Optional[FullyShardedDataParallelPlugin], params: Mapping[str, Any]) -> None:
    # the launcher's config decides what is tested: it must be what the cell says it tests
    if plugin is None:
        return  # no FSDP at all: the wrapper check says so
    want = fsdp_version(params)
    got = getattr(plugin, "fsdp_version", 1)
    if got != want:
        raise RuntimeError(f"the accelerate launch config gives fsdp_version {got}, the cell is FSDP{want}")
    if want == 1 and bool(plugin.use_orig_params) != flag(params, "orig"):
        raise RuntimeError(f"the accelerate launch config gives use_orig_params={plugin.use_orig_params}")


def entry_of(params: Mapping[str, Any]) -> str:
    """The cell's entry (``torch`` when the axis is absent); ValueError for an unknown one."""
    return axis(params, "entry", ENTRIES, default="torch")


def accelerate_train_and_check(
    model: nn.Module,
    params: Mapping[str, Any],
    ctx: RankContext,
    trainable: List[str],
    reference: Optional[Reference] = None,
) -> Dict[str, Any]:
    """The ``accelerate`` entry: prepare through accelerate, then train_and_check with accelerate's backward.

    ``reference`` (corruption.py) is taken from ``model`` before ``prepare`` when not given (for ``init``
    ``ram_efficient`` on rank 0, and broadcast: meta_init.reference_for)."""
    if reference is None:
        reference = reference_for(model, synthetic_batch(ctx), ctx, params)
    return prepare_and_train(model, params, ctx, trainable, reference=reference)


def entry_mixed_precision(params: Mapping[str, Any]) -> str:
    """The ``mp`` axis as accelerate's ``mixed_precision`` (and the Trainer's ``bf16``) spell it: ``no`` without
    one. Through these entries it is the user's setting, which accelerate turns into its own policy (and, for
    low-precision trainable parameters, an fp32 upcast: accelerate PR #2674)."""
    return axis(params, "mp", tuple(MIXED_PRECISION), default=None) or "no"


def prepare_and_train(
    model: nn.Module,
    params: Mapping[str, Any],
    ctx: RankContext,
    trainable: List[str],
    reference: Optional[Reference] = None,
    inspect: Optional[Callable[[nn.Module], Dict[str, Any]]] = None,
) -> Dict[str, Any]:
    """accelerate's ``prepare`` (accelerate_setup), then train_and_check with accelerate's optimizer and backward.

    ``inspect(prepared_model)`` adds to the checks what a repro looks at between ``prepare`` and training. Without
    ``reference`` the forward and sharding checks of corruption.py are not run (accelerate_train_and_check takes one).
    """
    with accelerate_setup(model, params, ctx, mixed_precision=entry_mixed_precision(params)) as setup:
        checks = setup.checks()
        if inspect is not None:
            checks.update(inspect(setup.model))
        checks.update(
            train_and_check(
                setup.model,
                ctx,
                trainable=trainable,
                optimizer=setup.optimizer,
                backward=setup.accelerator.backward,
                reference=reference,
                loop=Loop.for_accelerate(setup.accelerator, params),
                params=params,
                entry={
                    "mixed_precision": str(setup.accelerator.mixed_precision),
                    "checkpointing": getattr(setup.plugin, "activation_checkpointing", False),
                },
            )
        )
    return checks
