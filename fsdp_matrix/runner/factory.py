"""The one place a Launcher and its Session are built from ``LaunchOptions``: ``run``, ``bench`` and the pytest
plugin all open their session here, so a setting means the same thing in each."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, Optional

from fsdp_matrix.matrix import DEFAULT_MATRIX, Matrix
from fsdp_matrix.runner.launcher import Launcher
from fsdp_matrix.runner.options import LaunchOptions
from fsdp_matrix.runner.session import Session


def resolve_device(device: str) -> str:
    """``auto`` is cuda when a GPU is visible, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "cpu"


def resolve_world_size(world_size: Optional[int], device: str) -> int:
    """The given world size, else 2 ranks (on cuda, as many as there are GPUs, up to 2)."""
    if world_size is not None:
        return world_size
    if device == "cuda":
        import torch

        return max(1, min(2, torch.cuda.device_count()))
    return 2


def open_session(
    opts: LaunchOptions,
    matrix: Matrix,
    *,
    launches: Optional[Path] = None,
    versions: Optional[Dict[str, Optional[str]]] = None,
    python: str = sys.executable,
    **launcher: Any,
) -> Session:
    """A Session over a fresh Launcher. ``launches`` is where launch directories go (default: RESULTS/launches);
    ``versions`` what is installed (default: this interpreter's); ``launcher`` any other Launcher field."""
    from fsdp_matrix.envs import local_versions

    device = resolve_device(opts.device)
    run = Launcher(
        run_root=launches or opts.results / "launches",
        device=device,
        world_size=resolve_world_size(opts.world_size, device),
        cell_timeout=opts.cell_timeout,
        torchrun_args=opts.torchrun_argv,
        python=python,
        **launcher,
    )
    return Session(
        matrix,
        run,
        opts.results,
        local_versions() if versions is None else versions,
        combo=opts.combo,
        resume=opts.resume,
        repo_root=(opts.matrix or DEFAULT_MATRIX).resolve().parent,
    )
