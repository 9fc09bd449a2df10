"""The collectives check: FSDP's collectives counted per optimizer step and per unit, against what the wrap promises.

Root-only sharding, per-layer hooks that never fire (accelerate's regional compilation before 1.14.0, PR #4022) and a
reduce-scatter on every micro-step (accelerate's FSDP2 ``no_sync`` before 1.11.0, PR #3762) all train to the right
values: the value checks see nothing. A spy on ``torch.distributed`` counts each all-gather, reduce-scatter and
all-reduce FSDP calls while a step runs, and finds the unit it was for from the caller's frame (FSDP2's
``FSDPParamGroup``, FSDP1's ``FlatParamHandle``). The promises, per optimizer step of ``k`` micro-steps, checked where
the parameters are really sharded (world size > 1, a sharding strategy that shards):

- every unit the wrap promises exists (``decoder_layer``/``fsdp2``: one per decoder layer plus the root);
- every unit that holds trainable parameters all-gathers at least once per forward (``k`` times), and
  reduce-scatters at most once: accumulation defers it to the last micro-step (``no_sync`` /
  ``set_requires_gradient_sync(False)`` / ``accumulate()`` / the Trainer's loop). A unit of frozen weights only is
  not judged (a module a step never calls, such as a disabled adapter's, is legitimate there);
- every unit that holds trainable parameters reduce-scatters at least once over the run, and the run all-gathers
  (a world of one rank per cell trained alone: 0 of each, reliability review 2026-11-28 defect 3);
- no FSDP1 unit runs NO_SHARD unless the cell asked ``shard: none`` (FSDP1's fallback on a 1-rank group).

torch 2.13 calls ``all_gather_single`` / ``reduce_scatter_single``; older releases ``all_gather_into_tensor`` /
``reduce_scatter_tensor`` (``_all_gather_base`` / ``_reduce_scatter_base`` before them): every name this torch has is
spied on, through the ``torch.distributed`` attribute FSDP calls (``dist.<name>``).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from torch import distributed as dist
from torch import nn

from fsdp_matrix.workload.checks import clean_name

KINDS = {
    "all_gather": ("all_gather_single", "all_gather_into_tensor", "_all_gather_base", "all_gather"),
    "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter"),
    "all_reduce": ("all_reduce",),
}
"""Each counted kind and the ``torch.distributed`` functions that are it, on any torch release."""
OTHER = "<other>"
"""The unit name of a collective no FSDP unit called (the entry's own: loss logging, a clip's norm, the checks')."""
SHARDED_WRAPS = {
    "decoder_layer": "layers",
    "fsdp2": "layers",
    "root": "root",
    "root_only": "root",
    "fsdp2_root": "root",
}
"""What each ``wrap`` value promises: a unit per decoder layer plus the root, or the root alone (``peft_policy``: the
units PEFT's policy picks, not promised here)."""


def _unit_of_frame(frame: Any) -> Optional[nn.Module]:
    """The module of the FSDP unit a collective is for, read from its caller's frames; None when none is."""
    depth = 0
    while frame is not None and depth < 40:
        local = frame.f_locals
        group = local.get("self")
        if type(group).__name__ == "FlatParamHandle":  # FSDP1: the handle's own unshard / all-gather
            return group._fully_sharded_module
        if type(group).__name__ == "FSDPParamGroup":  # FSDP2: unshard / post_backward of one group
            modules = getattr(group, "modules", None) or (getattr(group, "module", None),)
            return modules[0]
        handle = local.get("handle")
        if handle is not None and hasattr(handle, "_fully_sharded_module"):  # FSDP1: _unshard / _reduce_grad
            return handle._fully_sharded_module
        frame, depth = frame.f_back, depth + 1
    return None


@dataclass
class CollectiveSpy:
    """Counts FSDP's collectives per optimizer step and per unit while ``spying()`` is on.

    ``step()`` closes one optimizer step's counts; ``paused()`` leaves out the harness's own collectives (the
    checks' all-reduce of gradient norms)."""

    names: Dict[int, str] = field(default_factory=dict)
    """id(module) -> the unit's cleaned module name (``<root>`` for the model itself)."""
    steps: List[Counter] = field(default_factory=list)
    """One Counter per closed optimizer step, keyed (kind, unit name)."""
    current: Counter = field(default_factory=Counter)
    """The step in progress."""
    paused_depth: int = 0
    """> 0 inside ``paused()``."""

    def record(self, kind: str) -> None:
        if self.paused_depth:
            return
        module = _unit_of_frame(sys._getframe(2))
        unit = OTHER if module is None else self.names.get(id(module), OTHER)
        self.current[(kind, unit)] += 1

    def step(self) -> None:
        """Close the optimizer step in progress."""
        self.steps.append(self.current)
        self.current = Counter()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.paused_depth += 1
        try:
            yield
        finally:
            self.paused_depth -= 1

    @contextlib.contextmanager
    def spying(self) -> Iterator[CollectiveSpy]:
        """Patch every counted ``torch.distributed`` function for the block; restore them after."""
        saved: List[Tuple[str, Any]] = []

        def counted(kind: str, original: Any) -> Any:
            @functools.wraps(original)
            def call(*args: Any, **kwargs: Any) -> Any:
                self.record(kind)
                return original(*args, **kwargs)

            return call

        for kind, names in KINDS.items():
            for name in names:
                original = getattr(dist, name, None)
                if original is not None:
                    saved.append((name, original))
                    setattr(dist, name, counted(kind, original))
        try:
            yield self
        finally:
            for name, original in saved:
                setattr(dist, name, original)


def unit_name(name: str) -> str:
    """A module's name on the unwrapped model (FSDP1/compile/checkpoint wrappers dropped), ``<root>`` for the model."""
    return clean_name(name + ".").rstrip(".") or "<root>"


def fsdp_unit_modules(model: nn.Module) -> Dict[str, Tuple[nn.Module, bool, bool]]:
    """Every FSDP unit of ``model`` by unit name: (the module its collectives name, holds parameters, holds
    trainable parameters)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    units: Dict[str, Tuple[nn.Module, bool, bool]] = {}
    for name, module in model.named_modules():
        if isinstance(module, FullyShardedDataParallel):
            handle = module._handle
            flat = None if handle is None else handle.flat_param
            key = module if handle is None else handle._fully_sharded_module
            units[unit_name(name)] = (key, flat is not None, bool(flat is not None and flat.requires_grad))
            continue
        state = getattr(module, "_get_fsdp_state", None)
        if state is None or not callable(state):
            continue
        group = state()._fsdp_param_group
        group_params = [] if group is None else [p.sharded_param for p in group.fsdp_params]
        units[unit_name(name)] = (module, bool(group_params), any(p.requires_grad for p in group_params))
    return units


def decoder_layer_names(model: nn.Module) -> List[str]:
    """Unit names of the decoder layers (modules whose class name ends in ``DecoderLayer``)."""
    return [unit_name(n) for n, m in model.named_modules() if type(m).__name__.endswith("DecoderLayer")]


@dataclass
class Promise:
    """What a cell's wrap promises about its collectives."""

    units: List[str]
    """Unit names the wrap promises (decoder layers plus ``<root>``), or the units found where it promises none."""
    sharded: bool
    """The parameters are really sharded (world size > 1, a strategy that shards): the counts are judged."""
    deferred_sync: bool = True
    """The loop defers gradient sync to the last micro-step (every entry here does, as its users do)."""
    world_size: int = 1
    """Ranks the cell's id names."""
    shard: Optional[str] = "full"
    """The ``shard`` axis the cell asked (``full`` where it has none); None: not known (a caller that gave no
    params), then what the units run is taken as asked."""
    strategies: Dict[str, str] = field(default_factory=dict)
    """FSDP1 unit name -> the sharding strategy it runs (``NO_SHARD``, ...); empty under FSDP2."""


def fsdp1_strategies(model: nn.Module) -> Dict[str, str]:
    """Each FSDP1 unit's sharding strategy by unit name (what FSDP1 chose: NO_SHARD on a 1-rank group)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return {
        unit_name(n): m.sharding_strategy.name
        for n, m in model.named_modules()
        if isinstance(m, FullyShardedDataParallel)
    }


def promise_of(model: nn.Module, wrap: Optional[str], world_size: int, shard: Optional[str] = "full") -> Promise:
    """What ``wrap`` promises for ``model`` (its unwrapped or wrapped form): see SHARDED_WRAPS. ``shard`` None: the
    cell's ``shard`` axis is not known; the counts are judged when no unit runs NO_SHARD or HYBRID_SHARD."""
    kind = SHARDED_WRAPS.get(wrap or "")
    if kind == "layers":
        units = sorted(set(decoder_layer_names(model))) + ["<root>"]
    elif kind == "root":
        units = ["<root>"]
    else:
        units = sorted(fsdp_unit_modules(model))
    strategies = fsdp1_strategies(model)
    if shard is None:
        shards = not any(s == "NO_SHARD" or "HYBRID" in s for s in strategies.values())
    else:
        shards = shard in ("full", "grad_op")
    return Promise(units, world_size > 1 and shards, world_size=world_size, shard=shard, strategies=strategies)


def per_step(spy: CollectiveSpy) -> List[Dict[str, int]]:
    """Each closed step's totals per kind (every unit and the entry's own together), for ``checks``."""
    out = []
    for counts in spy.steps:
        totals = Counter()
        for (kind, _), n in counts.items():
            totals[kind] += n
        out.append({kind: totals.get(kind, 0) for kind in KINDS})
    return out


def _unshard_judged(name: str, module: nn.Module) -> bool:
    """Whether a unit's all-gathers per forward are judged. Not for an FSDP1 unit that is not FULL_SHARD/HYBRID_SHARD
    (NO_SHARD never all-gathers; SHARD_GRAD_OP keeps its parameters between forward and backward), and not for the
    root: in fix-holds cells on torch 2.13 (modules-to-save with the decoder-layer wrap, dora-sharded-weight with
    shard_none / shard_grad_op) the spy counted 0 all-gathers for those units, so what it would promise there is not
    established. Their counts are still reported."""
    if name == "<root>":
        return False
    strategy = getattr(module, "sharding_strategy", None)  # FSDP1 only; an FSDP2 unit always reshards here
    return strategy is None or getattr(strategy, "name", "") in ("FULL_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")


def _fallbacks(promise: Promise) -> List[str]:
    """FSDP1 units that run NO_SHARD where the cell asked a sharding strategy over more than one rank: FSDP1's
    fallback on a 1-rank group (or a policy that picked it), a failed sharding promise unless the cell asked
    ``shard: none``."""
    if promise.world_size < 2 or promise.shard in (None, "none"):
        return []
    fell = sorted(u for u, strategy in promise.strategies.items() if strategy == "NO_SHARD")
    if not fell:
        return []
    return [
        f"collectives: {len(fell)}/{len(promise.strategies)} FSDP1 units run NO_SHARD, the cell asked "
        f"{promise.shard} sharding over {promise.world_size} ranks: {fell[:3]}"
    ]


def _never_exchanged(spy: CollectiveSpy, units: Dict[str, Tuple[nn.Module, bool, bool]]) -> List[str]:
    """Where the promise is sharded: a trainable unit whose gradients were never reduce-scattered in any optimizer
    step, and a run that all-gathered nothing at all. Over the whole run, not per step: the first step of FSDP1 with
    bf16 mixed precision counted 0 reduce-scatters in fix-holds cells (mixed-dtype ``mp_bf16``, the TRL entry in
    bf16), then 2 and 8 per step. A unit of frozen weights only is not judged (LoRA added after ``fully_shard``
    leaves every unit frozen: its plain tensors are judged by "ranks agree")."""
    total = Counter()
    for counts in spy.steps:
        total.update(counts)
    failures = [
        f"collectives: unit {name} reduce-scattered 0 times in {len(spy.steps)} optimizer steps (its trainable "
        "gradients were never sharded)"
        for name, (_, _, trains) in sorted(units.items())
        if trains and not total.get(("reduce_scatter", name), 0)
    ]
    trains = any(t for _, _, t in units.values())
    if trains and not sum(n for (kind, _), n in total.items() if kind == "all_gather"):
        failures.append(f"collectives: 0 all-gathers in {len(spy.steps)} optimizer steps (nothing was ever unsharded)")
    return failures


def judge_counts(
    spy: CollectiveSpy, units: Dict[str, Tuple[nn.Module, bool, bool]], promise: Promise, micro_steps: int
) -> Tuple[Dict[str, Any], List[str]]:
    """The ``collectives`` checks entry and the broken promises, each naming the unit and its count."""
    found: Dict[str, Any] = {
        "per_step": per_step(spy),
        "units": len(units),
        "promised_units": len(promise.units),
        "micro_steps": micro_steps,
        "judged": promise.sharded,
    }
    failures: List[str] = _fallbacks(promise)
    if not promise.sharded or not spy.steps:
        found["failed"] = len(failures)
        return found, failures
    missing = [u for u in promise.units if u not in units]
    if missing:
        failures.append(f"collectives: {len(missing)}/{len(promise.units)} promised FSDP units missing: {missing[:3]}")
    failures += _never_exchanged(spy, units)
    for i, counts in enumerate(spy.steps):
        for name, (module, _, trains) in sorted(units.items()):
            if not trains:
                continue  # a unit of frozen weights only: nothing of it must be synced, and the value checks see it
            gathers = counts.get(("all_gather", name), 0)
            if gathers < micro_steps and _unshard_judged(name, module):
                # reported, not failed: fix-holds cells on torch 2.13 (dora-sharded-weight with shard_none and
                # shard_grad_op) counted 0 all-gathers for units whose forward ran, so the spy's promise is not
                # established for every sharding strategy yet
                found.setdefault("unshard_short", []).append(
                    f"step {i} unit {name} all-gathered {gathers} times over {micro_steps} forwards "
                    "(its pre-forward unshard never ran)"
                )
            scatters = counts.get(("reduce_scatter", name), 0)
            if promise.deferred_sync and scatters > 1:
                failures.append(
                    f"collectives: step {i} unit {name} reduce-scattered {scatters} times over {micro_steps} "
                    "micro-steps (promised: once per optimizer step)"
                )
    found["failed"] = len(failures)
    return found, failures[:6]
