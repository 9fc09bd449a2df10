"""Verification of an env: installed versions against the pins, distributions with missing files, imports.

Each probe runs the env's own interpreter, bounded; a missing interpreter or a probe that hangs is an EnvError
(``import_check`` returns it as its message), never an uncaught exception.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from packaging.version import InvalidVersion, Version

from fsdp_matrix.envs.uvproc import tail
from fsdp_matrix.errors import EnvError

DEFAULT_IMPORTS = ("torch", "transformers", "peft", "accelerate")
"""What must import for an env of the packages under test to count as usable."""

_INSPECT_SCRIPT = """
import json, os, sys
from importlib import metadata
out = {"versions": {}, "broken": {}}
for name in sys.argv[1:]:
    try:
        out["versions"][name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out["versions"][name] = None
# an install cut off half way leaves a distribution whose RECORD lists files that are not there
for dist in metadata.distributions():
    files = [f for f in (dist.files or []) if not f.name.endswith(".pyc")]
    missing = [str(f) for f in files if not os.path.exists(dist.locate_file(f))]
    if missing:
        out["broken"][dist.metadata["Name"]] = missing[:3]
print(json.dumps(out))
"""


def _probe(python: Path, args: Sequence[str], timeout: float, what: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise EnvError(f"cannot {what}: no interpreter at {python} (the env is missing or was removed)") from None
    except OSError as exc:
        raise EnvError(f"cannot {what} with {python}: {exc}") from None
    except subprocess.TimeoutExpired:
        raise EnvError(f"cannot {what}: {python} did not answer within {timeout:.0f}s") from None


def inspect_env(python: Path, names: Sequence[str], timeout: float = 120) -> Dict[str, Dict]:
    """``{"versions": {name: version or None}, "broken": {dist: [missing files]}}``; EnvError if it cannot tell."""
    proc = _probe(python, ["-c", _INSPECT_SCRIPT, *names], timeout, "read installed versions")
    if proc.returncode != 0:
        raise EnvError(f"cannot read installed versions with {python}: {tail(proc.stderr, 5)}")
    return json.loads(proc.stdout)


def installed_versions(python: Path, names: Sequence[str], timeout: float = 120) -> Dict[str, Optional[str]]:
    """Installed version of each name (None if absent); EnvError on a missing interpreter or a timeout."""
    return inspect_env(python, names, timeout)["versions"]


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


OPTIONAL_IMPORTS = {"trl": "trl.trainer.sft_trainer"}
"""What an optional package's cells import: ``import trl`` is lazy and succeeds where its trainers cannot import
(trl 0.8.6 without ``rich``, observed 2026-11-24 on peft0.10-tf4.40)."""


def imports_for(installed: Sequence[str], imports: Sequence[str] = DEFAULT_IMPORTS) -> List[str]:
    """``imports`` plus each optional package (trl) among ``installed``: an env that pins one must import it, or
    every cell that needs it would fail one by one instead of one env-error."""
    from fsdp_matrix.rules import OPTIONAL_PACKAGES

    wanted = [OPTIONAL_IMPORTS.get(p, p) for p in OPTIONAL_PACKAGES if p in installed]
    return list(imports) + [m for m in wanted if m not in imports]


def import_check(python: Path, modules: Sequence[str] = DEFAULT_IMPORTS, timeout: float = 300) -> Optional[str]:
    """None when the modules import in the env, else why not (the error's last lines, a timeout, no interpreter)."""
    if not modules:
        return None
    try:
        proc = _probe(python, ["-c", "import " + ", ".join(modules)], timeout, "import " + ", ".join(modules))
    except EnvError as exc:
        return str(exc)
    return None if proc.returncode == 0 else tail(proc.stderr, 15)


def python_version(python: Path, timeout: float = 60) -> Tuple[int, int]:
    """(major, minor) of the env's interpreter; EnvError if it cannot tell."""
    proc = _probe(python, ["-c", "import sys; print(*sys.version_info[:2])"], timeout, "read the Python version")
    try:
        major, minor = (int(p) for p in proc.stdout.split())
    except ValueError:
        raise EnvError(f"cannot read the Python version of {python}: {tail(proc.stderr, 5)}") from None
    return major, minor
