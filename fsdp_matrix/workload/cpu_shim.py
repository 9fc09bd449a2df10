"""The smallest shim that lets accelerate (and the Trainer, which builds an Accelerator) reach their real FSDP code on
CPU. Applied only when the device is CPU; on GPU every part is a no-op, and accelerate picks FSDP itself.

Why it is needed (read in accelerate's ``AcceleratorState.__init__``, observed from accelerate 0.29.3 to 1.15.0):
accelerate switches to ``DistributedType.FSDP`` only for accelerator device types (MULTI_GPU, MULTI_NPU, ...).
On CPU it stays ``MULTI_CPU``, drops the FSDP plugin, and ``prepare`` wraps the model in DistributedDataParallel,
silently. What the shim does, each part recorded in the cell's ``checks["shim"]``:

(A) ``ACCELERATE_TORCH_DEVICE=cpu`` before the first ``PartialState``, for FSDP1 and for every Trainer cell (a
    transformers that ignores ``fsdp_config["version"]`` builds FSDP1 for an FSDP2 cell, which must then fail on the
    wrapper it got): otherwise accelerate's device is ``cpu:0``, FSDP1 gets it as ``device_id`` and refuses it
    (``Inconsistent compute device and `device_id` on rank 0: cpu vs cpu:0``), a CPU-only artifact. The variable is
    accelerate's own (PR #1009, v0.16.0).
(B) ``force_fsdp``: after ``Accelerator(fsdp_plugin=..., cpu=True)``, do what the skipped branch would have done:
    ``distributed_type = FSDP`` in AcceleratorState *and* in PartialState's shared dict (every later
    ``AcceleratorState()`` copies that dict back over its own; without it bf16 cells revert to DDP),
    ``state.fsdp_plugin = plugin``, ``plugin.set_mixed_precision(...)``.
(C) ``transformers.trainer.Accelerator = CpuFsdpAccelerator``: the Trainer builds its own Accelerator; this subclass
    applies (B) to it (and builds the plugin from ``ACCELERATE_USE_FSDP``/``FSDP_*`` env as accelerate itself would,
    for transformers 4.x, which passes no plugin, and for ``accelerate launch``).
(D) FSDP1 FULL_STATE_DICT saves, only for cells that save (``saves=True``): ``offload_to_cpu=True`` assumes an
    accelerator. On CPU the "move" is a no-op and torch then frees storage the state dict still uses (segfault,
    model side) or reuses one buffer for every optimizer state (silent corruption, optimizer side):
    ``FlatParamHandle.to_cpu`` becomes a no-op on CPU, and the plugin's ``optim_state_dict_config.offload_to_cpu``
    is turned off.
(E) ``sync_module_states`` on CPU, only for ram-efficient cells (``ram_efficient=True``): the plugin's
    ``__post_init__`` looks for an accelerator to build its ``param_init_fn`` and raises ``RuntimeError: There are
    currently no available devices found`` on a CPU-only machine (accelerate 0.29.3-1.15.0, read; the raise is its
    last step). The shim lets that one error through as what accelerate would have built on a device:
    ``param_init_fn = lambda m: m.to_empty(device=cpu, recurse=False)``.

Everything is undone when ``cpu_fsdp_shim`` exits, so the next cell in the same process starts clean.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, List, Optional

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

DEVICE_ENV = "ACCELERATE_TORCH_DEVICE"


class ShimRecord:
    """What the shim did in one cell, for ``checks["shim"]``: one short line per applied part, empty on GPU."""

    def __init__(self, active: bool, saves: bool = False) -> None:
        self.active = active
        """True on CPU: only then may any part apply."""
        self.saves = saves
        """The cell saves FSDP1 state dicts: (D) applies."""
        self.applied: List[str] = []
        """Lines such as ``(B) distributed_type MULTI_CPU -> FSDP``."""

    def note(self, line: str) -> None:
        if line not in self.applied:
            self.applied.append(line)


_CURRENT: List[ShimRecord] = []  # the record of the shim in force, for CpuFsdpAccelerator built inside it


def force_fsdp(accelerator: Accelerator, plugin: Optional[FullyShardedDataParallelPlugin]) -> None:
    """(B) Route ``accelerator.prepare`` through accelerate's FSDP code on CPU; no-op unless the state is MULTI_CPU."""
    state = accelerator.state
    if plugin is None or state.distributed_type != DistributedType.MULTI_CPU:
        return
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    state.fsdp_plugin = plugin
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    line = "(B) distributed_type MULTI_CPU -> FSDP, fsdp_plugin kept"
    saves = bool(_CURRENT) and _CURRENT[-1].saves
    if saves and getattr(plugin, "fsdp_version", 1) == 1:
        osd = getattr(plugin, "optim_state_dict_config", None)
        if type(osd).__name__ == "FullOptimStateDictConfig" and osd.offload_to_cpu:
            osd.offload_to_cpu = False
            line += "; (D) optim_state_dict_config.offload_to_cpu=False"
    if _CURRENT:
        _CURRENT[-1].note(line)


class CpuFsdpAccelerator(Accelerator):
    """(C) An Accelerator that ends up FSDP on CPU when given, or told by env to build, an FSDP plugin."""

    def __init__(self, *args, fsdp_plugin=None, **kwargs):
        if fsdp_plugin is None and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
            # what Accelerator.__init__ does itself, built here to keep hold of the plugin that CPU state drops
            fsdp_plugin = FullyShardedDataParallelPlugin()
        super().__init__(*args, fsdp_plugin=fsdp_plugin, **kwargs)
        self.chosen_by_accelerate = str(self.state.distributed_type)
        """accelerate's own choice, before the shim (e.g. ``DistributedType.MULTI_CPU``)."""
        force_fsdp(self, fsdp_plugin)


def _cpu_noop_to_cpu(original):
    @contextlib.contextmanager
    def to_cpu(self):
        if self.device.type == "cpu":
            yield  # already on the CPU: moving is a no-op, and freeing the unsharded storage would break the views
        else:
            with original(self):
                yield

    return to_cpu


NO_DEVICE = "There are currently no available devices found"
"""The start of accelerate's error when ``sync_module_states`` finds no accelerator (part (E))."""


def _cpu_post_init(original, record: ShimRecord):
    def post_init(self, *args, **kwargs):
        try:
            original(self, *args, **kwargs)
        except RuntimeError as exc:
            if NO_DEVICE not in str(exc) or not self.sync_module_states:
                raise
            cpu = torch.device("cpu")
            self.param_init_fn = lambda module: module.to_empty(device=cpu, recurse=False)
            record.note("(E) sync_module_states on CPU: param_init_fn = to_empty(device=cpu, recurse=False)")

    return post_init


@contextlib.contextmanager
def cpu_fsdp_shim(
    device: torch.device,
    fsdp_version: int,
    trainer: bool = False,
    saves: bool = False,
    ram_efficient: bool = False,
) -> Iterator[ShimRecord]:
    """Apply (A), (C), (D) and (E) for one cell on CPU and undo them on exit; (B) is ``force_fsdp``.

    ``fsdp_version`` 1 adds (A), and with ``saves`` (D); ``trainer`` adds (C) and (A); ``ram_efficient`` adds (E)
    (noted when it took effect). On a non-CPU device nothing applies.
    """
    record = ShimRecord(device.type == "cpu", saves)
    saved_env = os.environ.get(DEVICE_ENV)
    undo = []
    if record.active:
        if fsdp_version == 1 or trainer:
            os.environ[DEVICE_ENV] = "cpu"
            record.note(f"(A) {DEVICE_ENV}=cpu")
        if fsdp_version == 1 and saves:
            from torch.distributed.fsdp._flat_param import FlatParamHandle

            original = FlatParamHandle.to_cpu
            FlatParamHandle.to_cpu = _cpu_noop_to_cpu(original)
            undo.append(lambda: setattr(FlatParamHandle, "to_cpu", original))
            record.note("(D) FlatParamHandle.to_cpu is a no-op on CPU")
        if trainer:
            import transformers.trainer

            original_cls = transformers.trainer.Accelerator
            transformers.trainer.Accelerator = CpuFsdpAccelerator
            undo.append(lambda: setattr(transformers.trainer, "Accelerator", original_cls))
            record.note("(C) transformers.trainer.Accelerator = CpuFsdpAccelerator")
        if ram_efficient:
            original_post_init = FullyShardedDataParallelPlugin.__post_init__
            FullyShardedDataParallelPlugin.__post_init__ = _cpu_post_init(original_post_init, record)
            undo.append(lambda: setattr(FullyShardedDataParallelPlugin, "__post_init__", original_post_init))
    _CURRENT.append(record)
    try:
        yield record
    finally:
        _CURRENT.pop()
        for step in reversed(undo):
            step()
        if saved_env is None:
            os.environ.pop(DEVICE_ENV, None)
        else:
            os.environ[DEVICE_ENV] = saved_env
