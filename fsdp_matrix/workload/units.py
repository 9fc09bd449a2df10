"""The structural check: what FSDP built, against what the wrap and the config promise (issue 39, point 2).

A model can be sharded "as promised" by unit count and collective counts and still be wrong in ways users pay for
silently. Right after wrapping, this check reads:

- **units**: the module each FSDP unit owns (FSDP1: each ``FullyShardedDataParallel`` and its
  ``_fsdp_wrapped_module``; FSDP2: each ``fully_shard`` state with a parameter group, named after its first module:
  ``fully_shard([a, b])`` is one unit over both);
- **ownership**: which unit manages each parameter. A parameter managed by two units fails, and so do tied
  parameters (one ``Parameter`` under several names before wrapping) that end up managed by two units: FSDP2
  ``fully_shard`` on the embedding and on the head of a tied model gives each its own DTensor, the tie silently
  broken (torch 2.13 refuses it at lazy init, "shared with a parameter already managed by another FSDP group";
  older torch stays silent). A parameter no unit manages is counted (``unmanaged``; ``unmanaged_in_units`` where
  its module sits inside a unit: an adapter outside the unit its base layer is in), not failed: fix-holds cells
  have them by design (LoRA added after ``fully_shard``; accelerate's FSDP2 leaves uint8 4-bit weights out of its
  groups), and "ranks agree" (shards.py) judges their values;
- **checkpointing**: which modules are checkpoint-wrapped (``CheckpointWrapper`` / ``_checkpoint_wrapped_module``)
  or carry transformers' ``gradient_checkpointing`` flag. None unless the cell asks for checkpointing; where it
  asks, only decoder layers are (a wrapper around another module checkpoints the wrong thing: memory, not values);
- **buffers**: none is left on the meta device, each is on the cell's device, and every rank holds the same bytes
  (rank 0's, where ``init`` ``ram_efficient`` loads on rank 0 and broadcasts; the same values built on every rank
  otherwise). A buffer left on meta or unbroadcast trains without an error.

``checks["structure"]`` carries a compact summary: units per module class, checkpointed modules, tied groups and
the failures. Every rank's findings are gathered, so all ranks reach the same verdict.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from fsdp_matrix.workload.checks import _as_bytes, clean_name
from fsdp_matrix.workload.shards import gather

_CHECKPOINTED = "_checkpoint_wrapped_module"
ROOT = "<root>"


def module_name(name: str) -> str:
    """A module's name on the unwrapped model (wrapper prefixes dropped), ``<root>`` for the model itself."""
    return clean_name(name + ".").rstrip(".") or ROOT


def _join(prefix: str, name: str) -> str:
    return name if prefix == ROOT else f"{prefix}.{name}"


def tied_groups(model: nn.Module) -> List[List[str]]:
    """Cleaned names that share one ``Parameter`` object (tied embeddings), each group sorted; read before wrapping.
    Not collective."""
    by_id: Dict[int, List[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(clean_name(name))
    return sorted(sorted(set(names)) for names in by_id.values() if len(set(names)) > 1)


def _fsdp1_owned(name: str, module: Any) -> Optional[List[str]]:
    handle = getattr(module, "_handle", None)
    flat = None if handle is None else handle.flat_param
    if flat is None:
        return None
    prefix = module_name(name)
    owned = [_join(prefix, clean_name(fqn)) for fqn in flat._fqns]
    # a parameter tied within one unit is flattened once; its other names are the unit's shared parameters
    for info in getattr(flat, "_shared_param_infos", None) or ():
        owned.append(_join(prefix, clean_name(f"{info.module_name}.{info.param_name}".lstrip("."))))
    return owned


def _fsdp2_owned(module: nn.Module, names: Dict[int, str], seen: set) -> Optional[List[str]]:
    state = getattr(module, "_get_fsdp_state", None)
    if state is None or not callable(state):
        return None
    state = state()
    # fully_shard([a, b]) gives every module of the list the same state and one parameter group: one unit, named
    # after the first of them met (accelerate 1.15.0 groups a tied embedding and head so, PR #4171)
    if id(state) in seen:
        return None
    seen.add(id(state))
    group = getattr(state, "_fsdp_param_group", None)
    owned: List[str] = []
    for fsdp_param in [] if group is None else group.fsdp_params:
        info = fsdp_param._module_info
        pairs = [(info.module, info.param_name), *getattr(info, "shared_modules", ())]
        for pair in pairs:
            owner, attr = pair if isinstance(pair, tuple) else (pair, info.param_name)
            owned.append(_join(names.get(id(owner), "?"), attr))
    return owned


def _class_name(module: nn.Module) -> str:
    # fully_shard swaps a module's class for a subclass named FSDP<class>: the class the user wrote is its base
    name = type(module).__name__
    bases = [c.__name__ for c in type(module).__mro__[1:]]
    return name[4:] if name.startswith("FSDP") and name[4:] in bases else name


def unit_ownership(model: nn.Module) -> Tuple[Dict[str, str], Dict[str, List[str]]]:
    """(unit name -> the class of the module it owns, cleaned parameter name -> the units that manage it), on an
    FSDP1 or FSDP2 model. Not collective."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    names = {id(m): module_name(n) for n, m in model.named_modules()}
    units: Dict[str, str] = {}
    owners: Dict[str, List[str]] = {}
    states: set = set()
    for name, module in model.named_modules():
        if isinstance(module, FullyShardedDataParallel):
            owned = _fsdp1_owned(name, module)
            inner = module._fsdp_wrapped_module
        else:
            owned, inner = _fsdp2_owned(module, names, states), module
        if owned is None:
            continue
        unit = module_name(name)
        units[unit] = _class_name(getattr(inner, _CHECKPOINTED, inner))
        for param in owned:
            owners.setdefault(param, []).append(unit)
    return units, owners


def checkpointed_modules(model: nn.Module) -> Tuple[List[str], List[str]]:
    """(modules inside a ``CheckpointWrapper``, modules with transformers' ``gradient_checkpointing`` flag on), by
    name on the unwrapped model. Not collective."""
    wrapped, flagged = [], []
    for name, module in model.named_modules():
        if hasattr(module, _CHECKPOINTED):
            wrapped.append(module_name(name))
        elif getattr(module, "gradient_checkpointing", False) is True:
            flagged.append(module_name(name))
    return sorted(set(wrapped)), sorted(set(flagged))


def _decoder_layers(model: nn.Module) -> List[str]:
    return sorted({module_name(n) for n, m in model.named_modules() if type(m).__name__.endswith("DecoderLayer")})


@dataclass
class StructurePromise:
    """What the wrap and the config promise about the structure FSDP builds."""

    checkpointing: Optional[bool] = False
    """The cell asks for activation checkpointing (True), asks none (False: no module may be checkpointed), or it is
    not known (None: where modules are checkpointed they must still be decoder layers)."""
    tied: List[List[str]] = field(default_factory=list)
    """Cleaned names sharing one parameter before wrapping (``tied_groups``); empty where not known."""
    device: Optional[torch.device] = None
    """The cell's device, where every buffer must be; None: only meta is refused."""
    checkpoint_kind: Optional[str] = None
    """How the cell asks for checkpointing, from its ``ac`` axis (activation.ac_kind): ``fsdp`` (every decoder layer
    inside a ``CheckpointWrapper``, nothing else wrapped, no transformers flag), ``hf`` (no wrapper, every decoder
    layer under a module whose ``gradient_checkpointing`` flag is on), ``none`` (nothing wrapped or flagged). None:
    judged by ``checkpointing`` alone."""


def _owner_failures(owners: Dict[str, List[str]], tied: List[List[str]]) -> List[str]:
    """Parameters managed twice, and tied parameters split over units."""
    failures = []
    twice = sorted(p for p, managing in owners.items() if len(set(managing)) > 1)
    if twice:
        failures.append(
            f"structure: {len(twice)} parameters managed by more than one FSDP unit, e.g. {twice[0]} "
            f"({', '.join(sorted(set(owners[twice[0]])))})"
        )
    for group in tied:
        managed = sorted({u for name in group for u in owners.get(name, [])})
        if len(managed) > 1:
            failures.append(
                f"structure: tied parameters {', '.join(group)} are managed by {len(managed)} FSDP units "
                f"({', '.join(managed)}): the tie is broken, each trains its own copy"
            )
    return failures


def _inside_a_unit(params: List[str], units: Dict[str, str]) -> List[str]:
    """The names in ``params`` that sit inside the module of a unit other than the root."""
    return [p for p in params if any(u != ROOT and p.startswith(u + ".") for u in units)]


def _covered(layer: str, flagged: List[str]) -> bool:
    """Is ``layer`` flagged itself, or inside a flagged module (transformers 4.x flags the decoder stack)?"""
    return any(f in (layer, ROOT) or layer.startswith(f + ".") for f in flagged)


def _kind_failures(wrapped: List[str], flagged: List[str], layers: List[str], kind: str) -> List[str]:
    """What the cell's ``ac`` value promises (StructurePromise.checkpoint_kind), against what was found."""
    failures = []
    if kind == "none" and (wrapped or flagged):
        failures.append(
            f"structure: ac none, yet {len(wrapped)} checkpoint-wrapped and {len(flagged)} gradient_checkpointing-"
            f"flagged modules, e.g. {(wrapped or flagged)[0]}"
        )
    if kind == "fsdp":
        missing = sorted(set(layers) - set(wrapped))
        extra = sorted(set(wrapped) - set(layers))
        if missing:
            failures.append(f"structure: ac fsdp, {len(missing)}/{len(layers)} decoder layers not checkpoint-wrapped")
        if extra:
            failures.append(
                f"structure: ac fsdp, {len(extra)} checkpoint wrappers around modules not decoder layers: {extra[:3]}"
            )
        if flagged:
            failures.append(f"structure: ac fsdp, transformers' gradient_checkpointing flag on too: {flagged[:3]}")
    if kind == "hf":
        bare = [layer for layer in layers if not _covered(layer, flagged)]
        if wrapped:
            failures.append(f"structure: ac hf, yet {len(wrapped)} modules in a CheckpointWrapper: {wrapped[:3]}")
        if bare:
            failures.append(
                f"structure: ac hf, {len(bare)}/{len(layers)} decoder layers under no gradient_checkpointing flag"
            )
    return failures


def _checkpoint_failures(model: nn.Module, promise: StructurePromise) -> Tuple[List[str], List[str], List[str]]:
    wrapped, flagged = checkpointed_modules(model)
    if promise.checkpoint_kind is not None:
        return wrapped, flagged, _kind_failures(wrapped, flagged, _decoder_layers(model), promise.checkpoint_kind)
    layers = set(_decoder_layers(model))
    failures = []
    if promise.checkpointing is False and (wrapped or flagged):
        first = (wrapped or flagged)[0]
        failures.append(
            f"structure: {len(wrapped)} checkpoint-wrapped and {len(flagged)} gradient_checkpointing-flagged modules, "
            f"the cell asked no checkpointing, e.g. {first}"
        )
    wrong = [m for m in wrapped if m not in layers]
    if wrong and promise.checkpointing is not False:
        failures.append(f"structure: {len(wrong)} checkpoint wrappers around modules not decoder layers: {wrong[:3]}")
    if promise.checkpointing is True and not flagged and layers - set(wrapped):
        failures.append(
            f"structure: checkpointing asked, {len(layers - set(wrapped))}/{len(layers)} decoder layers not "
            "checkpoint-wrapped and no gradient_checkpointing flag on"
        )
    return wrapped, flagged, failures


def _buffer_lines(model: nn.Module, device: Optional[torch.device]) -> Tuple[Dict[str, Any], List[str]]:
    """(cleaned buffer name -> a digest of its bytes, None on meta; the buffers not on ``device``). Not collective."""
    mine: Dict[str, Any] = {}
    astray = []
    for name, buf in model.named_buffers():
        key = clean_name(name)
        mine[key] = None if buf.is_meta else hashlib.sha1(_as_bytes(buf).numpy().tobytes()).hexdigest()
        if not buf.is_meta and device is not None and buf.device.type != device.type:
            astray.append(f"{key} on {buf.device}")
    return mine, astray


def _buffer_failures(seen: List[Tuple[Dict[str, Any], List[str]]]) -> List[str]:
    """Buffers on meta or off the device on some rank, and buffers whose bytes differ from rank 0's."""
    failures = []
    for rank, (mine, astray) in enumerate(seen):
        meta = sorted(k for k, v in mine.items() if v is None)
        if meta:
            failures.append(f"structure: rank {rank} holds {len(meta)} buffers on the meta device, e.g. {meta[0]}")
        if astray:
            failures.append(f"structure: rank {rank} holds {len(astray)} buffers off the cell's device: {astray[:2]}")
    first = seen[0][0]
    for rank, (mine, _) in enumerate(seen[1:], start=1):
        differ = sorted(
            k
            for k in set(first) | set(mine)
            if k not in first or k not in mine or (first[k] is not None and mine[k] is not None and first[k] != mine[k])
        )
        if differ:
            failures.append(
                f"structure: rank {rank}'s buffers differ from rank 0's (left unbroadcast?): {len(differ)}, "
                f"e.g. {differ[0]}"
            )
    return failures


def check_structure(model: nn.Module, promise: StructurePromise) -> Tuple[Dict[str, Any], List[str]]:
    """The structural check right after wrapping: (``{"structure": summary}``, failures). Collective."""
    units, owners = unit_ownership(model)
    wrapped, flagged, failures = _checkpoint_failures(model, promise)
    failures = _owner_failures(owners, promise.tied) + failures
    unmanaged = [
        clean_name(n) for n, _ in model.named_parameters() if clean_name(n) not in owners and "_flat_param" not in n
    ]
    seen = gather((_buffer_lines(model, promise.device), failures))
    failures = _buffer_failures([s[0] for s in seen])
    for _, theirs in seen:
        failures += [line for line in theirs if line not in failures]
    classes: Dict[str, int] = {}
    for cls in units.values():
        classes[cls] = classes.get(cls, 0) + 1
    summary = {
        "units": len(units),
        "unit_classes": dict(sorted(classes.items())),
        "managed": len(owners),
        "unmanaged": len(unmanaged),
        "unmanaged_in_units": len(_inside_a_unit(unmanaged, units)),
        "checkpoint_wrapped": wrapped,
        "checkpoint_flagged": flagged,
        "tied": promise.tied,
        "buffers": len(seen[0][0][0]),
        "failed": len(failures),
    }
    return {"structure": summary}, failures


CHECKPOINT_AXES = ("ac", "gc")
"""The axes by which a cell asks for activation checkpointing (any value but ``none``)."""


def checkpointing_asked(params: Optional[Mapping[str, Any]], *entry_asks: Any) -> Optional[bool]:
    """Whether the cell asks for activation checkpointing: through an ``ac``/``gc`` axis, or its entry's own setting
    (``entry_asks``: the Trainer's ``gradient_checkpointing``, the plugin's ``activation_checkpointing``). None
    where nothing is known (a caller without ``params``, whose entry asks nothing)."""
    if any(bool(a) for a in entry_asks):
        return True
    if params is None:
        return None
    return any(str(params.get(a, "none")) != "none" for a in CHECKPOINT_AXES)
