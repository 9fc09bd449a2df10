"""One ``uv pip install`` into an env: the user's index configuration, a CUDA-build check, bounded, with progress.

A CPU install is dry-run first and refused if it would pull a CUDA build of torch (unless the combo opts in: the
torch axis, where only the CUDA build of most releases exists). uv runs bounded (per request and in all) in its own
process group, which dies with the harness.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from packaging.utils import canonicalize_name

from fsdp_matrix.envs import downloads
from fsdp_matrix.envs.config import configured_locations, uv_environment
from fsdp_matrix.envs.cputorch import cpu_index, user_torch_sources, with_cpu_torch
from fsdp_matrix.envs.uvproc import failure, install_timeout, run_uv, tail
from fsdp_matrix.errors import EnvError
from fsdp_matrix.progress import Heartbeat

_CUDA_ONLY = re.compile(r"^(nvidia-|triton$|pytorch-triton)")


@dataclass
class InstallResult:
    """The outcome of one ``uv pip install`` into an env."""

    ok: bool
    """Whether the installer succeeded."""
    output: str
    """Everything the installer printed: the env-error message when not ok."""
    duration_s: float
    """Wall time of the install."""
    skipped: bool = False
    """True when the env's stamp showed these exact requirements already installed."""


def cuda_packages(dry_run_output: str) -> List[str]:
    """Packages a dry run would install that only a CUDA build of torch needs."""
    names = re.findall(r"^\s*\+\s*([A-Za-z0-9_.-]+)==", dry_run_output, flags=re.M)
    return [n for n in names if _CUDA_ONLY.match(canonicalize_name(n))]


def install(
    python: Path,
    requirements: Sequence[str],
    *,
    device: str = "cpu",
    exclude_newer: Optional[str] = None,
    extra_args: Sequence[str] = (),
    timeout: Optional[float] = None,
    allow_cuda_build: bool = False,
    label: str = "",
) -> InstallResult:
    """Install exact requirements into the env of ``python``. Never raises for an installer failure: returns it.

    A CPU install is dry-run first. If it would pull a CUDA build of torch, torch is taken from PyTorch's CPU index
    (``cputorch``), said in one line; where that cannot be, it is refused. A combo that opts in with
    ``allow_cuda_build`` (the torch axis) installs the CUDA build instead, after one line naming the download size.
    While uv runs, a heartbeat line shows every 10 s.
    """
    start = time.monotonic()
    env = uv_environment()
    timeout = install_timeout() if timeout is None else timeout
    args = ["pip", "install", "--python", str(python), *extra_args]
    if exclude_newer:
        args += ["--exclude-newer", exclude_newer]
    name = f"env {label}" if label else f"env {python.parent.parent.name}"
    with Heartbeat(name, "uv resolving") as beat:
        if device == "cpu":
            dry = run_uv(args + ["--dry-run", *requirements], env, timeout)
            if dry.returncode != 0:
                return InstallResult(False, failure(dry, "the dry run", env), time.monotonic() - start)
            cuda = cuda_packages(dry.output)
            if cuda and not allow_cuda_build:
                beat.update("looking for torch on the CPU index")
                swapped, why = _torch_from_cpu_index(requirements, python, args, env, timeout, beat)
                if swapped is None:
                    return InstallResult(False, _refusal(cuda, why), time.monotonic() - start)
                requirements, cuda = swapped, []
            if cuda:
                beat.update("estimating the download")
                torch = next((v for n, v in downloads.planned(dry.output) if n == "torch"), "?")
                size = downloads.estimate(dry.output, {**os.environ, **env}, configured_locations()).describe()
                beat.say(
                    f"no CPU build of torch {torch} is reachable through your pip/uv configuration: installing the "
                    f"CUDA build from the index (it runs on CPU), {size}"
                )
        beat.update("uv installing")
        proc = run_uv(args + list(requirements), env, max(1.0, timeout - (time.monotonic() - start)))
    ok = proc.returncode == 0
    return InstallResult(ok, tail(proc.output) if ok else failure(proc, "the install", env), time.monotonic() - start)


def run_quiet(cmd: Sequence[str], timeout: float = 30) -> str:
    """stdout of a probe command, or "" if it is missing or fails."""
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _refusal(cuda: Sequence[str], why: str) -> str:
    return (
        f"refusing to download a CUDA build of torch for a CPU run (it would pull {', '.join(cuda[:4])}...). "
        "Point pip or uv at a CPU build: pip's find-links or index-url, or UV_INDEX, UV_FIND_LINKS or "
        f"UV_TORCH_BACKEND=cpu. {why}"
    ).strip()


def _torch_from_cpu_index(
    requirements: Sequence[str], python: Path, args: List[str], env: Dict[str, str], timeout: float, beat: Heartbeat
) -> Tuple[Optional[List[str]], str]:
    """The requirements with torch taken from PyTorch's CPU index (said in one line), or None and why not."""
    served = user_torch_sources(configured_locations())
    if served:
        return None, (
            f"(Your configuration serves torch ({served[0]}), only not a CPU build of this release: it wins, so "
            "PyTorch's CPU index was not tried.)"
        )
    index = cpu_index()
    if index is None:
        return None, "(FSDP_MATRIX_TORCH_CPU_INDEX is empty or UV_TORCH_BACKEND is set: no CPU index was tried.)"
    try:
        swapped, version = with_cpu_torch(requirements, python, index, configured_locations().cafile)
    except EnvError as exc:
        return None, str(exc)
    dry = run_uv(args + ["--dry-run", *swapped], env, timeout)
    if dry.returncode != 0:
        return None, f"With torch from {index}: {failure(dry, 'the dry run', env)}"
    still = cuda_packages(dry.output)
    if still:
        return None, f"With torch from {index}, the install still pulls {', '.join(still[:4])}."
    beat.say(
        f"no CPU build of torch {version} is reachable through your pip/uv configuration: installing torch from "
        f"PyTorch's CPU index {index} (FSDP_MATRIX_TORCH_CPU_INDEX; your own configuration takes precedence)"
    )
    return swapped, ""
