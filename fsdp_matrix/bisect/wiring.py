"""The one wiring of a bisection's collaborators, for ``bisect``, ``bisect --git``, ``upgrade`` and ``nightly``.

Every command that bisects takes the same step options (``--matrix``, ``--device``, ``--world-size`` from the launch
options, plus ``--cache`` and ``--timeout``), declared here once, and turns them into the same pair: a
``PinnedInstaller`` over a combo's pins and a ``LaunchRunner`` that runs the cells of a step on one launch.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from fsdp_matrix import options
from fsdp_matrix.bisect.installers import PinnedInstaller
from fsdp_matrix.bisect.runner import LaunchRunner
from fsdp_matrix.matrix import Combo
from fsdp_matrix.options import CONCRETE_DEVICE
from fsdp_matrix.paths import DEFAULT_CACHE, usable_dir
from fsdp_matrix.usage import positive_seconds


@dataclass(frozen=True)
class StepOptions:
    """How each step of a bisection runs."""

    cache: Path = DEFAULT_CACHE
    """Step envs, source snapshots and records (reused across runs)."""
    matrix: Optional[Path] = None
    """matrix.yaml (default: the repo's)."""
    device: str = "cpu"
    """cpu or cuda: the device the step envs are installed for and the cells run on."""
    world_size: Optional[int] = None
    """Ranks of the cells whose id names no world size."""
    timeout: float = 900
    """Seconds one step's launch may take (the backstop; the run command bounds each cell itself)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> StepOptions:
        return cls(args.cache or DEFAULT_CACHE, args.matrix, args.device, args.world_size, args.timeout)


def add_step_arguments(
    p: argparse.ArgumentParser, *, timeout: float, world_size: Optional[int] = None, cache_help: str = ""
) -> None:
    """Declare the step options on ``p``: the launch options through the one model, then --cache and --timeout."""
    defaults = {"world_size": world_size} if world_size is not None else None
    options.add_arguments(
        p.add_argument, ("matrix", "device", "world_size"), choices=CONCRETE_DEVICE, defaults=defaults
    )
    help_ = cache_help or "step envs, snapshots and records (reused across runs)"
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=help_)
    p.add_argument("--timeout", type=positive_seconds, default=timeout, help="seconds one step's launch may take")


@dataclass
class Bisection:
    """The two collaborators of a search: who installs a candidate's env, and who runs cells in it."""

    installer: PinnedInstaller
    """Installs the combo's pins with the candidate (the package bisected, or a whole pin set)."""
    runner: LaunchRunner
    """Runs a step's cells on one launch and reads their records back."""


def bisection_from(
    opts: StepOptions,
    combo: Combo,
    *,
    package: str = "peft",
    pins: Mapping[str, str] = (),
    world_size: Optional[int] = None,
    **runner: Any,
) -> Bisection:
    """The installer and runner for ``opts`` over ``combo`` (``pins`` override its pins for every step); ``runner``
    passes LaunchRunner's reporting and resume options (say, status, label, resume, bare)."""
    usable_dir(opts.cache)
    launcher = LaunchRunner(
        opts.cache,
        matrix=opts.matrix,
        device=opts.device,
        world_size=world_size or opts.world_size or 2,
        timeout=opts.timeout,
        **runner,
    )
    return Bisection(PinnedInstaller(combo, package, opts.cache, dict(pins or {}), opts.device), launcher)
