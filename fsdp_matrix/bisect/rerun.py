"""The nightly's reruns of flipped cells (fsdp_matrix/confirm.py): each in a fresh launch, in the column's env as it
ran tonight, or with the sources that moved put back at last night's commits.

The env is rebuilt from what tonight's records say (the versions of a release column, the commits of a column built
from source) in the step-env cache the bisects use, so a rerun and a later bisect share their installs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from fsdp_matrix.bisect.installers import PinnedInstaller
from fsdp_matrix.bisect.runner import LaunchRunner
from fsdp_matrix.bisect.wiring import StepOptions
from fsdp_matrix.confirm import PREVIOUS, RerunAsk
from fsdp_matrix.envs.sources import resolve_pins
from fsdp_matrix.errors import MatrixError
from fsdp_matrix.matrix import Combo

Sources = Dict[str, Dict[str, Dict[str, Any]]]
"""column -> package -> ``{url, commit, ...}`` as records keep a source build."""


@dataclass(frozen=True)
class NightEnvs:
    """What rebuilds each column's env: tonight's combos and sources, and last night's sources."""

    combos: Mapping[str, Combo]
    """column -> its combo pinned at tonight's versions (its releases; a source column's other packages)."""
    tonight: Sources
    """column -> the packages it built from source tonight."""
    last_night: Sources
    """column -> the packages it built from source last night."""
    opts: StepOptions
    """Cache, matrix, device, world size and timeout of each launch."""


def moved(envs: NightEnvs, column: str) -> Dict[str, Dict[str, Any]]:
    """The packages of ``column`` whose commit moved since last night: package -> last night's source."""
    before = envs.last_night.get(column) or {}
    return {
        p: before[p]
        for p, src in (envs.tonight.get(column) or {}).items()
        if p in before and src.get("commit") and before[p].get("commit") != src.get("commit")
    }


def rerun_env(ask: RerunAsk, envs: NightEnvs, installer: PinnedInstaller) -> Optional[Path]:
    """The env of ``ask``'s column (installed, or reused from the cache); None when it cannot be built."""
    combo = envs.combos[ask.column]
    sources = dict(envs.tonight.get(ask.column) or {})
    if ask.at == PREVIOUS:
        sources.update(moved(envs, ask.column))
    pins = combo.pins.model_dump()
    if not sources:
        return installer.install(pins, list(combo.extra)).env
    try:
        resolved = resolve_pins(
            [f"{p}={s['url']}@{s['commit']}" for p, s in sources.items()], envs.opts.cache / "sources"
        )
    except MatrixError as exc:
        print(f"nightly: rerun {ask.column}: {exc}", flush=True)
        return None
    # a source build's pin only names its env (one per commit)
    pins.update({p: f"git-{s['commit'][:12]}" for p, s in sources.items()})
    return installer.install(pins, list(combo.extra), sources=resolved).env


def rerun_cells(ask: RerunAsk, envs: NightEnvs) -> Dict[str, Optional[str]]:
    """The verdict of each cell of ``ask`` from one fresh launch (a cell without a record is left out)."""
    if ask.column not in envs.combos:
        return {}
    opts = envs.opts
    installer = PinnedInstaller(envs.combos[ask.column], "peft", opts.cache, device=opts.device)
    env = rerun_env(ask, envs, installer)
    if env is None:
        return {}
    runner = LaunchRunner(
        opts.cache, matrix=opts.matrix, device=opts.device, world_size=opts.world_size or 2, timeout=opts.timeout,
        resume=False,
    )  # fmt: skip
    got = runner.launch(env, f"rerun {ask.attempt} of {ask.column} ({ask.at})", list(ask.cells))
    return {cell: rec.verdict for cell, rec in got.records.items() if cell in ask.cells}
