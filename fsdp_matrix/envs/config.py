"""The package-index configuration, read in one place: the user's uv settings, else pip's translated to uv's.

uv does not read pip's configuration, and with no index configured it resolves ``torch`` to the multi-GB CUDA build.
So the user's pip settings (find-links, index-url, extra-index-url) are translated to uv's environment variables,
unless the user already configured uv itself. Everything else that needs the indexes (the release listing of
``bisect``, the download estimate) reads them back from those variables through ``configured_locations``, so uv
and the harness always look at the same places.
"""

from __future__ import annotations

import ast
import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from fsdp_matrix.envs.uvproc import http_settings

PYPI = "https://pypi.org/simple"
_UV_INDEX_VARS = ("UV_INDEX", "UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS")


@dataclass(frozen=True)
class Locations:
    """Where the installer looks for distributions."""

    indexes: Tuple[str, ...]
    """Simple API roots, the default index first."""
    find_links: Tuple[str, ...] = ()
    """Flat directories or HTML pages of distribution files."""
    cafile: Optional[str] = None
    """CA bundle pip is configured with (``cert``), for HTTPS indexes."""


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
        config[key.split(".", 1)[-1].strip()] = _unrepr(value.strip())
    return config


def _unrepr(value: str) -> str:
    """A value as pip prints it (``%r``): a multi-line setting comes out as ``'\\nurl1\\nurl2'``, escaped."""
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value.strip("'\"")
    return parsed if isinstance(parsed, str) else value


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
        env["UV_DEFAULT_INDEX"] = pip["index-url"].strip()
    if pip.get("extra-index-url"):
        env["UV_EXTRA_INDEX_URL"] = " ".join(pip["extra-index-url"].split())
    if pip.get("find-links"):
        env["UV_FIND_LINKS"] = ",".join(pip["find-links"].split())
    if "UV_EXTRA_INDEX_URL" in env or "UV_FIND_LINKS" in env:
        # pip takes the best version across all indexes; uv's default stops at the first index that has the name,
        # which would hide e.g. peft 0.21.2 behind a local mirror that only holds 0.21.0
        env.setdefault("UV_INDEX_STRATEGY", base.get("UV_INDEX_STRATEGY", "unsafe-best-match"))
    return env


def uv_locations(env: Mapping[str, str], cafile: Optional[str] = None) -> Locations:
    """The indexes and find-links that uv's variables in ``env`` name, the default index first."""
    default = env.get("UV_DEFAULT_INDEX") or env.get("UV_INDEX_URL") or PYPI
    extra: List[str] = env.get("UV_INDEX", "").split() + env.get("UV_EXTRA_INDEX_URL", "").split()
    # UV_INDEX entries may be named: name=url
    extra = [e.split("=", 1)[1] if "=" in e.split("://", 1)[0] else e for e in extra]
    links = [p for part in env.get("UV_FIND_LINKS", "").split(",") for p in part.split()]
    return Locations(tuple(dict.fromkeys([default, *extra])), tuple(links), cafile)


def configured_locations(
    environ: Optional[Mapping[str, str]] = None, pip: Optional[Dict[str, str]] = None
) -> Locations:
    """The index URLs and find-links uv is given: the user's uv variables, else pip's configuration translated."""
    environ = dict(os.environ if environ is None else environ)
    pip = pip_config() if pip is None else pip
    env = {k: v for k, v in environ.items() if k in _UV_INDEX_VARS}
    env.update(uv_environment(environ, pip))
    return uv_locations(env, pip.get("cert") or environ.get("SSL_CERT_FILE") or None)
