"""Where the files are read: here, when the installed libraries are the versions the user names; else in the env of
the combo whose pins are those versions (``.nox/matrix-<combo>`` or ``.nox/tests-<combo>``, when built), so that an
old config is read by the release that wrote it. When neither holds, the reading is done here and one line says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional

from fsdp_matrix.check.read import READ_PACKAGES, ReadError, Reading, read_all
from fsdp_matrix.installed import installed_versions
from fsdp_matrix.matrix import Matrix

REPO = Path(__file__).resolve().parents[2]
ENV_PREFIXES = ("matrix", "tests")
"""nox sessions whose env per combo is ``.nox/<session>-<combo>``."""
READ_TIMEOUT_S = 300.0
"""How long reading in another env may take (imports of transformers and TRL, about 10 s here)."""


@dataclass
class Read:
    """The readings and where they were made."""

    readings: List[Reading]
    """One per file, in KINDS order."""
    where: str
    """One line: ``installed here (...)``, ``in .nox/tests-old (combo old)``, or why the installed were used."""


def _differs(wanted: Mapping[str, Optional[str]], have: Mapping[str, Optional[str]]) -> List[str]:
    return [f"{p} {wanted[p]}" for p in READ_PACKAGES if wanted.get(p) and wanted.get(p) != have.get(p)]


def combo_env(matrix: Matrix, wanted: Mapping[str, Optional[str]]) -> Optional[Path]:
    """The python of a built env whose combo pins every reading library the user named at their version."""
    named = {p: v for p, v in wanted.items() if p in READ_PACKAGES and v}
    for combo in matrix.combos:
        pins = combo.pins.model_dump()
        if not named or any(pins.get(p) != v for p, v in named.items()):
            continue
        for prefix in ENV_PREFIXES:
            python = REPO / ".nox" / f"{prefix}-{combo.id}" / "bin" / "python"
            if python.exists():
                return python
    return None


def _versions_line(versions: Mapping[str, Optional[str]]) -> str:
    return ", ".join(f"{p} {versions.get(p) or '(not installed)'}" for p in READ_PACKAGES)


def read_in(python: Path, files: Dict[str, Path]) -> List[Reading]:
    """The readings made by ``python -m fsdp_matrix.check.read`` in another env."""
    argv = [str(python), "-m", "fsdp_matrix.check.read", *(f"{k}={Path(v).resolve()}" for k, v in files.items())]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    name = python.parents[1].name
    start = time.monotonic()
    # importing transformers and TRL in another env takes seconds: say what is being waited for
    print(f"check: reading {len(files)} file(s) in .nox/{name} ...", file=sys.stderr, flush=True)
    try:
        # in the caller's folder: a path inside a file (a fsdp_config JSON named by TrainingArguments) is theirs
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=READ_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReadError(f"reading in {name} failed: {exc}") from None
    try:
        data = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ReadError(f"reading in {name} failed: {tail}") from None
    print(f"check: read in .nox/{name} in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    if "error" in data:
        raise ReadError(data["error"])
    return [Reading(**r) for r in data["readings"]]


def read(matrix: Matrix, files: Dict[str, Path], wanted: Mapping[str, Optional[str]]) -> Read:
    """Read ``files`` with the libraries of the user's versions when they can be had, else with the installed."""
    have = installed_versions(READ_PACKAGES)
    off = _differs(wanted, have)
    if not files:
        return Read([], "no file given")
    if not off:
        return Read(read_all(files), f"read with the installed libraries ({_versions_line(have)})")
    python = combo_env(matrix, wanted)
    if python is not None and python.parents[1].resolve() != Path(sys.prefix).resolve():
        readings = read_in(python, files)
        return Read(readings, f"read in {python.parents[1].name} ({_versions_line(readings[0].versions)})")
    return Read(
        read_all(files),
        f"read with the installed libraries ({_versions_line(have)}), not {', '.join(off)}: no built env of a combo "
        "with those pins (build one with nox -s 'matrix(COMBO)' --install-only)",
    )
