"""Pinned envs: install, verify what got installed, and reuse an env only through its stamp.

An env is trusted only through its stamp, written after a verified install and invalidated before the next one
starts, so an install that is killed half way is redone, never taken for done.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from filelock import FileLock

from fsdp_matrix.envs.check import DEFAULT_IMPORTS, import_check, imports_for, inspect_env, mismatches
from fsdp_matrix.envs.installer import install
from fsdp_matrix.envs.sources import Resolved, write_env_sources
from fsdp_matrix.errors import EnvError
from fsdp_matrix.progress import Heartbeat

STAMP = "fsdp-matrix-env.json"


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

    ``sources`` replaces the pins of those packages with source builds (``envs.sources``): their requirement is
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
    # a source build replaces its pin; only its presence is verified (its version is whatever the commit says)
    sources = dict(sources or {})
    imports = imports_for([*pins, *sources], imports)
    requirements, pins = _requirements(pins, sources, extra, harness)
    stamp_key = (
        requirements
        + ([f"exclude-newer={exclude_newer}"] if exclude_newer else [])
        + [f"device={device}"]
        + list(stamp_extra)
    )
    reused = _reused(venv, python, stamp_key, pins, sources, label)
    if reused is not None:
        return reused
    options = dict(device=device, exclude_newer=exclude_newer, allow_cuda_build=allow_cuda_build)
    names = list(pins) + list(sources)
    installed = _install(python, requirements, names, invalidate_stamp(venv, stamp_key), label or venv.name, options)
    if isinstance(installed, EnvReport):
        return installed
    state, install_s, verify_start = installed
    versions = state["versions"]
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


def _requirements(
    pins: Mapping[str, str], sources: Mapping[str, Resolved], extra: Sequence[str], harness: Sequence[str]
) -> Tuple[List[str], Dict[str, str]]:
    """What to install (a source build in place of its pin), and the pins left to verify by version."""
    requirements = [sources[k].requirement if k in sources else f"{k}=={v}" for k, v in pins.items()]
    requirements += [s.requirement for k, s in sources.items() if k not in pins]
    requirements += list(extra) + list(harness)
    return requirements, {k: v for k, v in pins.items() if k not in sources}


def _reused(
    venv: Path,
    python: Path,
    stamp_key: List[str],
    pins: Mapping[str, str],
    sources: Mapping[str, Resolved],
    label: str,
) -> Optional[EnvReport]:
    """The report of an env whose stamp is current and whose packages are what it says; None when it must be
    (re)installed."""
    start = time.monotonic()
    if not is_current(venv, stamp_key):
        return None
    state = inspect_env(python, list(pins) + list(sources))
    wrong = _problems(state, pins) + _missing(state, sources)
    if not wrong:
        # the stamp keys on the commit: this run's url and ref may differ from those that built the env
        write_env_sources(venv, sources, state["versions"])
        return EnvReport(True, "", state["versions"], 0.0, time.monotonic() - start, reused=True)
    # something changed the env behind the stamp's back (a hand install, an old interrupted run): reinstall
    print(f"[env {label or venv.name}] stamp says current, but {'; '.join(wrong)}: reinstalling", flush=True)
    return None


def _install(
    python: Path,
    requirements: List[str],
    names: List[str],
    interrupted: bool,
    label: str,
    options: Mapping[str, Any],
) -> Union[EnvReport, Tuple[Dict, float, float]]:
    """Install ``requirements`` (again, once, for the packages an install cut off half way left broken): a failed
    install's report, else (the state of ``names`` in the env, install seconds, when verifying began)."""
    install_s = 0.0
    reinstall: List[str] = ["--reinstall"] if interrupted else []
    for attempt in range(2):
        result = install(python, requirements, extra_args=reinstall, label=label, **options)
        install_s += result.duration_s
        if not result.ok:
            return EnvReport(False, f"install failed: {result.output}", install_s=install_s)
        verify_start = time.monotonic()
        state = inspect_env(python, names)
        if not state["broken"] or attempt:
            break
        # files missing under a distribution uv counts as installed: an install cut off half way; rewrite those
        reinstall = [a for name in state["broken"] for a in ("--reinstall-package", name)]
    return state, install_s, verify_start


def _missing(state: Mapping[str, Dict], sources: Mapping[str, object]) -> List[str]:
    return [f"{name}: the source build is not installed" for name in sources if not state["versions"].get(name)]


def _problems(state: Mapping[str, Dict], pins: Mapping[str, str]) -> List[str]:
    wrong = mismatches(state["versions"], pins)
    return wrong + [f"{name}: files missing ({', '.join(files)})" for name, files in state["broken"].items()]


def local_versions() -> Dict[str, Optional[str]]:
    """Versions of the packages under test in this interpreter (what a record reports: the optional ones too, None
    when absent), plus python."""
    from fsdp_matrix.installed import installed_versions
    from fsdp_matrix.matrix import RULE_PACKAGES

    out = installed_versions(RULE_PACKAGES)
    out["python"] = ".".join(map(str, sys.version_info[:3]))
    return out
