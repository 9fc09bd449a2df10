"""The one place a Launcher and its Session are built from ``LaunchOptions``: ``run``, ``bench`` and the pytest
plugin all open their session here, so a setting means the same thing in each."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from fsdp_matrix.errors import LaunchError
from fsdp_matrix.matrix import DEFAULT_MATRIX, Matrix
from fsdp_matrix.options import LaunchOptions, rendezvous_nodes
from fsdp_matrix.runner.launcher import Launcher
from fsdp_matrix.runner.protocol import ENV_SHARE_GPU
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


def run_layout(opts: LaunchOptions, device: str) -> Tuple[int, int]:
    """(global world size, nodes) of the cells whose grid pins no layout: ``--world-size`` ranks on each node of
    ``--torchrun-args``' rendezvous (one node unless it says ``--nnodes``)."""
    nodes = rendezvous_nodes(opts.torchrun_argv)
    return resolve_world_size(opts.world_size, device) * nodes, nodes


def layout_refusal(opts: LaunchOptions, device: str, world_size: int, nodes: int) -> Optional[str]:
    """Why this run cannot launch ``world_size`` ranks on ``nodes`` nodes, in one line; None when it can (on this
    machine, as one torchrun agent per node with c10d on 127.0.0.1)."""
    theirs = rendezvous_nodes(opts.torchrun_argv)
    if theirs > 1 and (world_size, nodes) != run_layout(opts, device):
        ws, n = run_layout(opts, device)
        return (
            f"this run is one node of the {n}-node rendezvous of --torchrun-args ({ws // n} ranks each), which runs "
            f"only cells of that layout"
        )
    if opts.torchrun_argv != ["--standalone"] and theirs == 1 and nodes > 1:
        return "--torchrun-args gives a rendezvous of its own; a multi-node cell needs the harness's (the default)"
    if device == "cuda":
        import torch

        have = torch.cuda.device_count()
        if world_size // nodes * nodes > have and not (opts.share_gpu and have > 0):
            return f"needs {world_size} GPUs on this machine (one per rank); it has {have}"
    return None


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
    run_root = launches or opts.results / "launches"
    if opts.share_gpu and device == "cuda":
        launcher["env"] = {**launcher.get("env", {}), ENV_SHARE_GPU: "1"}
    common = dict(run_root=run_root, device=device, cell_timeout=opts.cell_timeout, python=python, **launcher)
    world_size, nodes = run_layout(opts, device)
    args = dict(torchrun_args=opts.torchrun_argv, shared_dir=opts.shared_dir)
    run = Launcher(world_size=world_size // nodes, **args, **common)

    def make_launcher(world_size: int, nodes: int) -> Launcher:
        """A launcher of another layout than the run's, on this machine: ``nodes`` agents of world_size / nodes."""
        refusal = layout_refusal(opts, device, world_size, nodes)
        if refusal:
            raise LaunchError(refusal)
        return Launcher(world_size=world_size // nodes, nodes=nodes, **common)

    return Session(
        matrix,
        run,
        opts.results,
        local_versions() if versions is None else versions,
        combo=opts.combo,
        resume=opts.resume,
        repo_root=(opts.matrix or DEFAULT_MATRIX).resolve().parent,
        make_launcher=make_launcher,
    )
