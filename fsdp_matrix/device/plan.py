"""Which cells a device run takes, in which order, and how they split into calls that each fit the device's limits.

A cell is in the plan when the device changes it: under the versions its site gives, the outcome the rules expect on
``cuda`` differs from the one on ``cpu`` (a rule, platform skip or signature that names ``device``), or it needs
``cuda`` (``requires: device: cuda``). Those run at world size 1 on ``cuda:0``: one GPU cannot hold two NCCL ranks
(docs/pages/gpu.md). A cell that cannot run at world size 1 (a pinned layout, ``min_world_size: 2``) is listed as
needing 2 GPUs. A sample of the other cases (one cell each) runs last, at world size 1 on CUDA too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from fsdp_matrix.cells import Cell, expand_case, unmet_requirement
from fsdp_matrix.device import image
from fsdp_matrix.expectations import expected_for
from fsdp_matrix.matrix import Case, Matrix

SCHEMA = 1
"""plan.json's shape; run.sh refuses a plan of another."""
BUDGET_S = 480
"""A call's whole run, wheels to report: 8 minutes, so that a second try fits in the 15 a session is lent."""
CELL_TIMEOUT_S = 120
"""One cell on the GPU (the tiny models take seconds; a hang is cut here)."""
CELL_EST_S = 8
"""A guess for one cell in a running launch, for packing calls; the run replaces it with what it measures."""
LAUNCH_EST_S = 40
"""A guess for one launch's start (torch, transformers and the ranks' process group)."""
COMBO = "gpu-image"
"""The combo id the records are filed under: the image's own versions (records carry what is installed)."""
MERGE_CASE = "merge-device"
"""Seed 002's case: its two releases are the plan's first cells."""


@dataclass(frozen=True)
class Step:
    """One ``python -m fsdp_matrix run`` (or the probe) of a run, in one site."""

    name: str
    """Step id: letters, digits, '-' (also the records' file name)."""
    kind: str
    """``cells`` (the harness's run) or ``probe`` (fsdp_matrix/device/probe.py: two ranks on one GPU)."""
    site: str
    """The front site (image.SITES) on PYTHONPATH; its stack lies under it."""
    why: str
    """What the step answers, in one line (printed as it starts)."""
    cells: Tuple[str, ...] = ()
    """CASE/CELL ids, at ``world_size``."""
    est_s: int = 0
    """Estimated seconds (launch + cells), for packing calls."""
    world_size: int = 1
    """Ranks of the step's launch: 2 only with ``share_gpu`` (one GPU holds one NCCL rank otherwise)."""
    share_gpu: bool = False
    """``run --share-gpu``: two ranks on one GPU, each with its own NCCL host id (the probe's nccl-hostid part)."""


@dataclass(frozen=True)
class Call:
    """One device command: the sites it installs, what it carries, and its steps in order."""

    index: int
    """1-based; ``run.sh --call N``."""
    sites: Tuple[str, ...]
    """Sites installed, in order."""
    steps: Tuple[str, ...]
    """Step names, in order of value."""
    carry: Tuple[str, ...] = ()
    """Paths (repo-relative) the device tool's ``carry`` names for this call."""
    bytes: int = 0
    """What travels: the working tree, plan, run.sh and these sites' wheels."""


@dataclass
class Plan:
    """plan.json: every step, the calls they are packed into, and the cells left for a machine of 2 GPUs."""

    steps: List[Step]
    """In order of value."""
    calls: List[Call] = field(default_factory=list)
    """Each fits the limits; call 1 holds the most valuable steps."""
    needs_2_gpus: List[str] = field(default_factory=list)
    """CASE/CELL ids (at their smallest layout) that no world-size-1 run reaches."""
    schema: int = SCHEMA
    """plan.json's shape."""
    combo: str = COMBO
    """Combo id of the records."""
    budget_s: int = BUDGET_S
    """Seconds a call may run in all."""
    cell_timeout_s: int = CELL_TIMEOUT_S
    """Seconds a cell may run."""
    versions: Dict[str, Dict[str, Optional[str]]] = field(default_factory=dict)
    """Per site: the versions planned for (the run records what is installed)."""
    smoke: Dict[str, str] = field(default_factory=dict)
    """Per site: a cell that runs on CPU at world size 1 under its versions. The rehearsal runs it too, so that each
    site's packages are imported by a real launch (the device's own cells mostly skip on CPU)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)


def _differs(case: Case, cell: Cell, versions: Mapping[str, Optional[str]]) -> bool:
    """True when the device changes what the rules say of ``cell`` (a ``cuda`` cell) under ``versions``."""
    cpu = replace(cell, device="cpu")
    if (unmet_requirement(case.requires, cell) is None) != (unmet_requirement(case.requires, cpu) is None):
        return True
    return expected_for(case, cell, versions).to_json() != expected_for(case, cpu, versions).to_json()


def device_cells(matrix: Matrix, versions: Mapping[str, Optional[str]]) -> List[Cell]:
    """The cells the device changes that run at world size 1 on cuda (the others are in two_gpu_cells)."""
    return [
        cell
        for case in matrix.cases
        for cell in expand_case(case, "cuda", 1)
        if cell.world_size == 1 and unmet_requirement(case.requires, cell) is None and _differs(case, cell, versions)
    ]


def two_gpu_cells(matrix: Matrix) -> List[Cell]:
    """Every cell (at its smallest layout above 1) that a world-size-1 run cannot reach: a grid that pins its layout,
    or a ``min_world_size`` requirement."""
    out = []
    for case in matrix.cases:
        ones = {c.params for c in expand_case(case, "cuda", 1) if c.world_size == 1}
        ones = {p for p in ones if unmet_requirement(case.requires, Cell(case.id, p, "cuda", 1)) is None}
        seen = set()
        for cell in sorted(expand_case(case, "cuda", 2), key=lambda c: c.world_size):
            if cell.params not in ones and cell.params not in seen:
                seen.add(cell.params)
                out.append(cell)
    return out


def sample_cells(matrix: Matrix, versions: Mapping[str, Optional[str]], taken: Sequence[str]) -> List[Cell]:
    """One cell of each case not in ``taken`` that runs at world size 1 on cuda and is not skipped there."""
    out = []
    for case in matrix.cases:
        if case.id in taken:
            continue
        for cell in expand_case(case, "cuda", 1):
            if cell.world_size != 1 or unmet_requirement(case.requires, cell) is not None:
                continue
            if expected_for(case, cell, versions).kind != "skip":
                out.append(cell)
                break
    return out


def smoke_cells(matrix: Matrix) -> Dict[str, str]:
    """Per site with cells: the first cell that runs on CPU at world size 1 and is not skipped under its versions."""
    out = {}
    for site in (image.BASE, image.OLD):
        for case in matrix.cases:
            cells = [c for c in expand_case(case, "cpu", 1) if c.world_size == 1]
            ready = [c for c in cells if unmet_requirement(case.requires, c) is None]
            hit = next((c for c in ready if expected_for(case, c, site.versions).kind not in ("skip", "none")), None)
            if hit is not None and hit.params_dict.get("entry") != "trl":
                out[site.name] = hit.key
                break
    return out


def _est(cells: Sequence[Cell]) -> int:
    return LAUNCH_EST_S + CELL_EST_S * len(cells)


def _step(name: str, site: str, why: str, cells: Sequence[Cell]) -> Step:
    return Step(name, "cells", site, why, tuple(c.key for c in cells), _est(cells))


def build_steps(matrix: Matrix) -> Tuple[List[Step], List[str]]:
    """The steps in order of value, and the cells that need 2 GPUs."""
    old, base = image.OLD, image.BASE
    old_cells = device_cells(matrix, old.versions)
    cells = device_cells(matrix, base.versions)
    merge_old = [c for c in old_cells if c.case == MERGE_CASE]
    merge_new = [c for c in cells if c.case == MERGE_CASE]
    rest = [c for c in cells if c.case != MERGE_CASE]
    # base's trl sits under this site but wants a newer transformers than the site's: no TRL cell runs here
    old_rest = [c for c in old_cells if c.case != MERGE_CASE and c.params_dict.get("entry") != "trl"]
    taken = sorted({c.case for c in cells + old_cells})
    steps = [
        _step(
            "merge-peft0.13.0", old.name, "seed 002: merge-device on peft 0.13.0 (the release with the bug)", merge_old
        ),
        _step("merge-fixed", base.name, "seed 002: merge-device on the image's peft (a fixed release)", merge_new),
        _step("cuda-cells", base.name, "every other cell the device changes, under the image's versions", rest),
        Step(
            "probe",
            "probe",
            "harness",
            "two ranks on one GPU: NCCL (expect 'Duplicate GPU detected'), "
            "NCCL with a host id per rank, gloo under FSDP1 and FSDP2",
            est_s=60,
        ),
        _step("cuda-cells-old", old.name, "the cells the device changes under peft 0.13.0's versions", old_rest),
        _step(
            "cpu-sample",
            base.name,
            "one cell of each other case, at world size 1 on CUDA",
            sample_cells(matrix, base.versions, taken),
        ),
    ]
    two = two_gpu_cells(matrix)
    steps.append(shared_step(matrix, base.versions, two, steps))
    steps = [s for s in steps if s.kind == "probe" or s.cells]
    return steps, [c.key for c in two]


ACCELERATE_ENTRIES = ("trainer", "trl")
"""Entries whose TrainingArguments put rank k on ``cuda:k`` (LOCAL_RANK) whatever the harness chose: rank 1 of two
on one GPU fails there with "CUDA error: invalid device ordinal" (seen 2026-11-28, checkpoint-roundtrip's
trainer_resume cells), a fault of the layout; so does accelerate's save_state, whose barrier runs on its own
``cuda:LOCAL_RANK`` (seen the same day). Accelerate's other paths ran on the shared layout (acc_save_model)."""


def _through_accelerate(cell: Cell) -> bool:
    params = cell.params_dict
    return (
        params.get("entry") in ACCELERATE_ENTRIES
        or any(str(v).startswith(("trainer_", "acc_save_state")) for v in params.values())
        or cell.case.startswith(("trainer-", "trl-"))
    )


def shared_step(
    matrix: Matrix, versions: Mapping[str, Optional[str]], two: Sequence[Cell], steps: Sequence[Step]
) -> Step:
    """The 2-rank cells on one GPU (``run --share-gpu``): first the base site's device cells (``cuda-cells``) at world
    size 2, the layout of the reports (fsdp2-4bit-forward's NCCL all-gather); then those no world-size-1 run reaches,
    whose skips under the image's versions are left out; then the sample's cells at world size 2, the layout of their
    CPU rules, so that cuda and cpu are compared at one layout (FSDP1 at world size 1 falls back to NO_SHARD: a
    different program). Not those through the Trainer (ACCELERATE_ENTRIES)."""
    cases = {c.id: c for c in matrix.cases}
    runnable = [c for c in two if expected_for(cases[c.case], c, versions).kind != "skip"]
    ones = {st.name: set(st.cells) for st in steps if st.name in ("cuda-cells", "cpu-sample")}

    def at_two(taken: set) -> List[Cell]:
        return [
            cell
            for case in matrix.cases
            for cell in expand_case(case, "cuda", 2)
            if cell.world_size == 2 and replace(cell, world_size=1).key in taken
        ]

    ordered = at_two(ones.get("cuda-cells", set())) + runnable + at_two(ones.get("cpu-sample", set()))
    cells = [c for c in ordered if c.world_size == 2 and not _through_accelerate(c)]
    why = "2 ranks on one GPU (NCCL, a host id per rank): the device cells, the 2-rank cells, the sample"
    return replace(_step("cuda-ws2-shared", image.BASE.name, why, cells), world_size=2, share_gpu=True)


def pack(
    steps: Sequence[Step],
    site_bytes: Mapping[str, int],
    fixed_bytes: int,
    limit: int,
    budget_s: int = BUDGET_S,
    stack: Callable[[str], Tuple[str, ...]] = image.stack,
) -> List[Call]:
    """Steps into calls, first fit in order of value: a step joins the first call whose bytes (``fixed_bytes`` + its
    sites' wheels) stay within ``limit`` and whose estimated time stays within ``budget_s`` with it, else opens the
    next call. Steps keep their order within a call; ``stack`` gives a site's stack, front first. ValueError when one
    step alone cannot fit."""
    calls: List[Tuple[List[str], List[str], List[int]]] = []  # (sites, step names, [estimated seconds])

    def size(sites: Sequence[str]) -> int:
        return fixed_bytes + sum(site_bytes.get(s, 0) for s in sites)

    for step in steps:
        need = list(reversed(stack(step.site)))  # the bottom site first: install order
        if size(need) > limit:
            raise ValueError(f"step {step.name} needs {size(need)} bytes with the tree; the limit is {limit}")
        for sites, names, spent in calls:
            merged = sites + [s for s in need if s not in sites]
            if size(merged) <= limit and spent[0] + step.est_s <= budget_s:
                sites[:], spent[0] = merged, spent[0] + step.est_s
                names.append(step.name)
                break
        else:
            calls.append((need, [step.name], [step.est_s]))
    return [Call(i + 1, tuple(s), tuple(n), bytes=size(s)) for i, (s, n, _) in enumerate(calls)]


def load(text: str) -> Plan:
    """A plan from plan.json's text; ValueError (one line) for another schema or a broken file."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"plan.json does not parse: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"plan.json is not a schema-{SCHEMA} plan (prepare it again with this checkout)")
    steps = [Step(**{**s, "cells": tuple(s["cells"])}) for s in data["steps"]]
    calls = [Call(**{k: tuple(v) if isinstance(v, list) else v for k, v in c.items()}) for c in data["calls"]]
    rest = {k: v for k, v in data.items() if k not in ("steps", "calls")}
    return Plan(steps, calls, **rest)
