"""Pinned envs: hand the user's pip index configuration to uv, install, and verify what got installed.

uv does not read pip's configuration, and with no index configured it resolves ``torch`` to the multi-GB CUDA build.
So the user's pip settings (find-links, index-url, extra-index-url) are translated to uv's environment variables,
unless the user already configured uv itself, and a CPU install is dry-run first and refused if it would pull CUDA
(unless the combo opts in: the torch axis, where only the CUDA build of most releases exists).

An env is trusted only through its stamp, written after a verified install and invalidated before the next one
starts, so an install that is killed half way is redone, never taken for done. uv runs bounded (per request and
in all) in its own process group, which dies with the harness.
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

from fsdp_matrix import downloads
from fsdp_matrix.envcheck import (  # noqa: F401  (re-exported: the verification half of this module's API)
    DEFAULT_IMPORTS,
    import_check,
    inspect_env,
    installed_versions,
    mismatches,
    same_release,
)
from fsdp_matrix.errors import EnvError
from fsdp_matrix.progress import Heartbeat
from fsdp_matrix.sources import Resolved, write_env_sources
from fsdp_matrix.uvproc import failure, http_settings, install_timeout, run_uv, tail

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
    env: Dict[str, str] = {"UV_COMPILE_BYTECODE": base.get("UV_COMPILE_BYTECODE", "1"), **http_settings(base)}
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


def _read_stamp(venv: Path) -> Dict:
    try:
        data = json.loads((venv / STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_current(venv: Path, requirements: Sequence[str]) -> bool:
    """True when the stamp says a finished install of exactly these requirements is in the env."""
    stamp = _read_stamp(venv)
    return stamp.get("hash") == requirements_hash(requirements) and not stamp.get("installing")


def write_stamp(venv: Path, requirements: Sequence[str], versions: Mapping[str, Optional[str]]) -> None:
    """Record a verified install. Written to a temporary file and renamed, so a kill never leaves half a stamp."""
    tmp = venv / f"{STAMP}.tmp"
    tmp.write_text(
        json.dumps(
            {"hash": requirements_hash(requirements), "requirements": sorted(requirements), "versions": dict(versions)},
            indent=1,
        )
    )
    os.replace(tmp, venv / STAMP)


def invalidate_stamp(venv: Path, requirements: Sequence[str]) -> bool:
    """Mark the env as being installed into, before anything changes in it; True if an earlier install was cut off.

    An install killed half way leaves the env neither as the old stamp says nor as the new pins say: without this the
    old stamp would still say "current" once the pins went back, and every later run would fail verification.
    """
    interrupted = bool(_read_stamp(venv).get("installing"))
    if venv.is_dir():
        tmp = venv / f"{STAMP}.tmp"
        tmp.write_text(
            json.dumps({"installing": requirements_hash(requirements), "requirements": sorted(requirements)})
        )
        os.replace(tmp, venv / STAMP)
    return interrupted


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

    A CPU install is dry-run first. If it would pull a CUDA build of torch, it is refused unless ``allow_cuda_build``
    (a combo that opts in); then one line names the combo and the download size before the download starts.
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
                return InstallResult(
                    False,
                    "refusing to download a CUDA build of torch for a CPU run (it would pull "
                    f"{', '.join(cuda[:4])}...). Point pip or uv at a CPU build: pip's find-links or "
                    "index-url, or UV_INDEX, UV_FIND_LINKS or UV_TORCH_BACKEND=cpu.",
                    time.monotonic() - start,
                )
            if cuda:
                beat.update("estimating the download")
                torch = next((v for n, v in downloads.planned(dry.output) if n == "torch"), "?")
                size = downloads.estimate(dry.output, {**os.environ, **env}).describe()
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
    *,
    allow_cuda_build: bool = False,
    label: str = "",
    imports: Sequence[str] = DEFAULT_IMPORTS,
    sources: Optional[Mapping[str, Resolved]] = None,
) -> EnvReport:
    """Install pins (+ extra + harness requirements) into ``venv`` unless its stamp says they are there; verify.

    ``sources`` replaces the pins of those packages with source builds (fsdp_matrix.sources): their requirement is
    the snapshot of a commit, so the stamp keys on the commit and dirty hash, and their version is not checked.

    Never raises for a broken env: an install, a verification or an import that fails (or times out, or finds no
    interpreter) gives a report that is not ok, with the reason.
    """
    # two runs at once must not install into one env together; the second waits, then finds the stamp current
    with FileLock(str(venv) + ".fsdp-matrix.lock"):
        try:
            args = (venv, pins, extra, harness, device, exclude_newer, stamp_extra, allow_cuda_build, label, imports)
            return _prepare(*args, sources)
        except EnvError as exc:
            return EnvReport(False, str(exc))


def _prepare(
    venv: Path,
    pins: Mapping[str, str],
    extra: Sequence[str],
    harness: Sequence[str],
    device: str,
    exclude_newer: Optional[str],
    stamp_extra: Sequence[str],
    allow_cuda_build: bool,
    label: str,
    imports: Sequence[str],
    sources: Optional[Mapping[str, Resolved]] = None,
) -> EnvReport:
    python = venv / "bin" / "python"
    # --- source pins (fsdp_matrix.sources): a source build replaces its pin; only its presence is verified
    sources = dict(sources or {})
    requirements = [sources[k].requirement if k in sources else f"{k}=={v}" for k, v in pins.items()]
    requirements += [s.requirement for k, s in sources.items() if k not in pins]
    pins = {k: v for k, v in pins.items() if k not in sources}
    # --- end source pins
    requirements += list(extra) + list(harness)
    stamp_key = (
        requirements
        + ([f"exclude-newer={exclude_newer}"] if exclude_newer else [])
        + [f"device={device}"]
        + list(stamp_extra)
    )
    start = time.monotonic()
    if is_current(venv, stamp_key):
        state = inspect_env(python, list(pins) + list(sources))
        wrong = _problems(state, pins) + _missing(state, sources)
        if not wrong:
            return EnvReport(True, "", state["versions"], 0.0, time.monotonic() - start, reused=True)
        # something changed the env behind the stamp's back (a hand install, an old interrupted run): reinstall
        print(f"[env {label or venv.name}] stamp says current, but {'; '.join(wrong)}: reinstalling", flush=True)
    interrupted = invalidate_stamp(venv, stamp_key)
    install_s = 0.0
    reinstall: List[str] = ["--reinstall"] if interrupted else []
    for attempt in range(2):
        result = install(
            python,
            requirements,
            device=device,
            exclude_newer=exclude_newer,
            extra_args=reinstall,
            allow_cuda_build=allow_cuda_build,
            label=label or venv.name,
        )
        install_s += result.duration_s
        if not result.ok:
            return EnvReport(False, f"install failed: {result.output}", install_s=install_s)
        verify_start = time.monotonic()
        state = inspect_env(python, list(pins) + list(sources))
        versions, broken = state["versions"], state["broken"]
        if not broken or attempt:
            break
        # files missing under a distribution uv counts as installed: an install cut off half way; rewrite those
        reinstall = [a for name in broken for a in ("--reinstall-package", name)]
    wrong = _problems(state, pins) + _missing(state, sources)
    if wrong:
        return EnvReport(
            False,
            "installed versions differ from the pins: " + "; ".join(wrong),
            versions,
            install_s,
            time.monotonic() - verify_start,
        )
    with Heartbeat(f"env {label or venv.name}", "import check: " + ", ".join(imports)):
        error = import_check(python, imports)
    if error:
        return EnvReport(False, f"import failed: {error}", versions, install_s, time.monotonic() - verify_start)
    write_env_sources(venv, sources, versions)
    write_stamp(venv, stamp_key, versions)
    return EnvReport(True, "", versions, install_s, time.monotonic() - verify_start)


def _missing(state: Mapping[str, Dict], sources: Mapping[str, object]) -> List[str]:
    return [f"{name}: the source build is not installed" for name in sources if not state["versions"].get(name)]


def _problems(state: Mapping[str, Dict], pins: Mapping[str, str]) -> List[str]:
    wrong = mismatches(state["versions"], pins)
    return wrong + [f"{name}: files missing ({', '.join(files)})" for name, files in state["broken"].items()]


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
