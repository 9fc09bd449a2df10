"""Pinned envs: hand the user's pip index configuration to uv, install, and verify what got installed.

uv does not read pip's configuration, and with no index configured it resolves ``torch`` to the multi-GB CUDA build.
So the user's pip settings (find-links, index-url, extra-index-url) are translated to uv's environment variables,
unless the user already configured uv itself, and a CPU install is dry-run first and refused if it would pull CUDA.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from filelock import FileLock
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from fsdp_matrix.clip import clip
from fsdp_matrix.errors import EnvError

STAMP = "fsdp-matrix-env.json"
_UV_INDEX_VARS = ("UV_INDEX", "UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS")
_CUDA_ONLY = re.compile(r"^(nvidia-|triton$|pytorch-triton)")


def pip_config(python: Optional[str] = None) -> Dict[str, str]:
    """pip's effective settings (``pip config list``), keyed without their scope: ``find-links``, ``index-url``...

    Without ``python``, the first interpreter that has pip answers: uv-built envs (nox's own included) have no
    pip, and reading nothing there would lose the user's find-links and send uv to the CUDA build of torch.
    """
    if python is None:
        return dict(_discovered_pip_config())
    try:
        out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    # pip lists env settings as ":env:.key"; they override the files, so read them last
    rows = [line.split("=", 1) for line in out.splitlines() if "=" in line]
    rows.sort(key=lambda kv: kv[0].startswith(":env:"))
    config: Dict[str, str] = {}
    for key, value in rows:
        config[key.split(".", 1)[-1].strip()] = value.strip().strip("'\"")
    return config


@functools.cache
def _discovered_pip_config() -> Dict[str, str]:
    # one `pip config list` per process: every install of a bisect or matrix run would otherwise ask again
    for candidate in dict.fromkeys(
        p
        for p in (
            sys.executable,
            getattr(sys, "_base_executable", None),
            shutil.which("python3"),
            shutil.which("python"),
        )
        if p
    ):
        config = pip_config(candidate)
        if config:
            return config
    return {}


def uv_environment(base: Optional[Mapping[str, str]] = None, pip: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Environment variables that make uv see the same indexes pip would, plus bytecode compilation.

    A user who configured uv (any UV_INDEX* / UV_FIND_LINKS variable) keeps exactly that configuration.
    """
    base = dict(os.environ if base is None else base)
    env: Dict[str, str] = {"UV_COMPILE_BYTECODE": base.get("UV_COMPILE_BYTECODE", "1")}
    if any(base.get(v) for v in _UV_INDEX_VARS):
        return env
    pip = pip_config() if pip is None else pip
    if pip.get("index-url"):
        env["UV_DEFAULT_INDEX"] = pip["index-url"]
    if pip.get("extra-index-url"):
        env["UV_EXTRA_INDEX_URL"] = " ".join(pip["extra-index-url"].split())
    if pip.get("find-links"):
        env["UV_FIND_LINKS"] = ",".join(pip["find-links"].split())
    if "UV_EXTRA_INDEX_URL" in env or "UV_FIND_LINKS" in env:
        # pip takes the best version across all indexes; uv's default stops at the first index that has the name,
        # which would hide e.g. peft 0.21.2 behind a local mirror that only holds 0.21.0
        env.setdefault("UV_INDEX_STRATEGY", base.get("UV_INDEX_STRATEGY", "unsafe-best-match"))
    return env


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


def requirements_hash(requirements: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:16]


def is_current(venv: Path, requirements: Sequence[str]) -> bool:
    try:
        return json.loads((venv / STAMP).read_text())["hash"] == requirements_hash(requirements)
    except (OSError, ValueError, KeyError):
        return False


def write_stamp(venv: Path, requirements: Sequence[str], versions: Mapping[str, Optional[str]]) -> None:
    (venv / STAMP).write_text(
        json.dumps(
            {"hash": requirements_hash(requirements), "requirements": sorted(requirements), "versions": dict(versions)},
            indent=1,
        )
    )


def _uv(args: List[str], env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["uv", *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})
    except FileNotFoundError:
        raise EnvError("uv is not installed: python -m pip install 'nox[uv]' (or uv)") from None
    except subprocess.TimeoutExpired as exc:
        raise EnvError(f"uv timed out after {timeout:.0f}s: {' '.join(exc.cmd)}") from None


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
    timeout: float = 1800,
) -> InstallResult:
    """Install exact requirements into the env of ``python``. Never raises for an installer failure: returns it."""
    start = time.monotonic()
    env = uv_environment()
    args = ["pip", "install", "--python", str(python), *extra_args]
    if exclude_newer:
        args += ["--exclude-newer", exclude_newer]
    if device == "cpu":
        dry = _uv(args + ["--dry-run", *requirements], env, timeout)
        if dry.returncode != 0:
            return InstallResult(False, _tail(dry.stderr + dry.stdout), time.monotonic() - start)
        cuda = cuda_packages(dry.stderr + dry.stdout)
        if cuda:
            return InstallResult(
                False,
                "refusing to download a CUDA build of torch for a CPU run (it would pull "
                f"{', '.join(cuda[:4])}...). Point pip or uv at a CPU build: pip's find-links/"
                "index-url, or UV_INDEX / UV_FIND_LINKS.",
                time.monotonic() - start,
            )
    proc = _uv(args + list(requirements), env, timeout)
    return InstallResult(proc.returncode == 0, _tail(proc.stderr + proc.stdout), time.monotonic() - start)


def run_quiet(cmd: Sequence[str], timeout: float = 30) -> str:
    """stdout of a probe command, or "" if it is missing or fails."""
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _tail(text: str, lines: int = 40) -> str:
    # uv's "Using Python ... environment at" preamble would otherwise be the first line every report shows
    kept = [line for line in text.strip().splitlines() if not line.startswith("Using Python ")]
    return clip("\n".join(kept), lines=lines, tail=True)


_VERSIONS_SCRIPT = """
import json, sys
from importlib import metadata
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def installed_versions(python: Path, names: Sequence[str]) -> Dict[str, Optional[str]]:
    proc = subprocess.run([str(python), "-c", _VERSIONS_SCRIPT, *names], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise EnvError(f"cannot read installed versions with {python}: {_tail(proc.stderr, 5)}")
    return json.loads(proc.stdout)


def same_release(installed: Optional[str], pinned: str) -> bool:
    """``2.13.0+cpu`` is the pinned ``2.13.0``: the local label names the build, not the release."""
    if installed is None:
        return False
    try:
        return Version(installed).public == Version(pinned).public
    except InvalidVersion:
        return installed == pinned


def mismatches(installed: Mapping[str, Optional[str]], pins: Mapping[str, str]) -> List[str]:
    return [
        f"{name}: pinned {want}, installed {installed.get(name) or 'nothing'}"
        for name, want in pins.items()
        if not same_release(installed.get(name), want)
    ]


def import_check(
    python: Path, modules: Sequence[str] = ("torch", "transformers", "peft", "accelerate"), timeout: float = 300
) -> Optional[str]:
    """None when the modules import in the env, else the error's last lines."""
    code = "import " + ", ".join(modules)
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=timeout)
    return None if proc.returncode == 0 else _tail(proc.stderr, 15)


@dataclass
class EnvReport:
    """The result of preparing one pinned env."""

    ok: bool
    """True when installed, verified against the pins and importable."""
    message: str = ""
    """The reason it is not ok: installer output, version mismatches or import error."""
    versions: Dict[str, Optional[str]] = field(default_factory=dict)
    """What is installed, by package name."""
    install_s: float = 0.0
    """Seconds spent installing (0 when the stamp was current)."""
    verify_s: float = 0.0
    """Seconds spent verifying."""
    reused: bool = False
    """True when nothing had to be installed."""


def prepare(
    venv: Path,
    pins: Mapping[str, str],
    extra: Sequence[str] = (),
    harness: Sequence[str] = (),
    device: str = "cpu",
    exclude_newer: Optional[str] = None,
    stamp_extra: Sequence[str] = (),
) -> EnvReport:
    """Install pins (+ extra + harness requirements) into ``venv`` unless its stamp says they are there; verify."""
    # two runs at once must not install into one env together; the second waits, then finds the stamp current
    with FileLock(str(venv) + ".fsdp-matrix.lock"):
        return _prepare(venv, pins, extra, harness, device, exclude_newer, stamp_extra)


def _prepare(
    venv: Path,
    pins: Mapping[str, str],
    extra: Sequence[str],
    harness: Sequence[str],
    device: str,
    exclude_newer: Optional[str],
    stamp_extra: Sequence[str],
) -> EnvReport:
    python = venv / "bin" / "python"
    requirements = [f"{k}=={v}" for k, v in pins.items()] + list(extra) + list(harness)
    stamp_key = (
        requirements
        + ([f"exclude-newer={exclude_newer}"] if exclude_newer else [])
        + [f"device={device}"]
        + list(stamp_extra)
    )
    reused = is_current(venv, stamp_key)
    result = InstallResult(True, "", 0.0, skipped=True)
    if not reused:
        result = install(python, requirements, device=device, exclude_newer=exclude_newer)
        if not result.ok:
            return EnvReport(False, f"install failed: {result.output}", install_s=result.duration_s)
    start = time.monotonic()
    versions = installed_versions(python, list(pins))
    wrong = mismatches(versions, pins)
    if wrong:
        return EnvReport(
            False,
            "installed versions differ from the pins: " + "; ".join(wrong),
            versions,
            result.duration_s,
            time.monotonic() - start,
        )
    if not reused:
        error = import_check(python)
        if error:
            return EnvReport(False, f"import failed: {error}", versions, result.duration_s, time.monotonic() - start)
        write_stamp(venv, stamp_key, versions)
    return EnvReport(True, "", versions, result.duration_s, time.monotonic() - start, reused)


def local_versions() -> Dict[str, Optional[str]]:
    """Versions of the packages under test in this interpreter (what a record reports), plus python."""
    from importlib import metadata

    from fsdp_matrix.matrix import PACKAGES

    out: Dict[str, Optional[str]] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    out["python"] = ".".join(map(str, sys.version_info[:3]))
    return out
