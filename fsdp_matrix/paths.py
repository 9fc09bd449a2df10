"""Checks on the paths ``bisect``, ``upgrade`` and ``nightly`` write to, made before anything is installed or run:
a ``--json`` that cannot be written must not cost a whole run first."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from fsdp_matrix.errors import EnvError

DEFAULT_CACHE = Path(tempfile.gettempdir()) / "fsdp-matrix-bisect"
"""Where ``bisect``, ``upgrade`` and ``nightly`` keep step envs, snapshots and records (reused across runs)."""


def usable_dir(path: Path, what: str = "--cache") -> Path:
    """Create ``path`` as a directory (with its parents), or say in one line why it cannot be one."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EnvError(f"{what} {path}: cannot be used as a directory: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise EnvError(f"{what} {path}: the directory is not writable")
    return path


def writable_file(path: Path, what: str = "--json") -> Path:
    """Check that ``path`` can be written (its parents are created), leaving no file behind where there was none."""
    if path.is_dir():
        raise EnvError(f"{what} {path}: is a directory, give a file path")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise EnvError(f"{what} {path}: cannot be written: {exc.strerror or exc}") from None
    if not existed:
        path.unlink()
    return path


def writable_folder(path: Path, what: str = "--shared-dir") -> Path:
    """Check that ``path`` is an existing directory this process can create a file in (a probe file, removed at
    once): an access check alone misses read-only mounts and immutable folders."""
    if not path.exists():
        raise EnvError(f"{what} {path}: no such directory")
    if not path.is_dir():
        raise EnvError(f"{what} {path}: not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".fsdp-matrix-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise EnvError(f"{what} {path}: cannot write there: {exc.strerror or exc}") from None
    return path
